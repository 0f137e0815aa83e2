"""MMaDA's image tokenizer: the MAGVIT-v2 encoder and its lookup-free quantiser (encoder side only).

MMaDA reads an image as 1024 discrete codes (32x32 over a 512 px image) from the ``showlab/magvitv2``
checkpoint; understanding needs those codes and never decodes, so only the encoder is here. No maintained
library ships this model (diffusers, transformers and timm have no MAGVIT-v2 LFQ encoder), so the modules
are written on torch layers, named so that the published state dict loads unchanged. Facts read from the
published code (Gen-Verse/dLLM-RL ``sample/vq/``; tests/models/fixtures/mmada/README.md):

- taming-VQGAN tensor names under ``encoder.``: ``conv_in``, ``down.{i}.block.{j}.{norm1,conv1,norm2,conv2,
  nin_shortcut}`` (``nin_shortcut``, a 1x1 conv, only where a block changes width), ``down.{i}.downsample.conv``
  (every level but the last; a 3x3 stride-2 conv after a zero pad of one column right and one row bottom),
  ``mid.block_1``, ``mid.attn_1.{norm,q,k,v,proj_out}``, ``mid.block_2``, ``norm_out``, ``conv_out``,
  ``quant_conv``; the quantiser's buffers ``quantize.embedding`` (the +-1 table) and ``quantize.power_vals``.
  ``decoder.*`` tensors are ignored. The down levels carry no attention: the published
  ``attn_resolutions [5]`` never equals a level's resolution.
- the sizes are hard-coded in the published class (its config.json has none): ch 128, ch_mult
  [1, 2, 2, 4, 4], num_res_blocks [4, 3, 4, 3, 4], z_channels = codebook_dim = 13 (8192 codes). They are
  :class:`MagvitConfig` fields here so a tiny encoder of the same structure can be tested.
- GroupNorm(32 groups, eps 1e-6, affine), swish; a block is norm1, swish, conv1, norm2, swish, conv2 plus the
  (shortcut) input; attention is single-head over the h*w positions, scaled by channels^-1/2.
- LFQ code of a position: ``sum_c [z_c > 0] * 2^(z-1-c)`` over the ``quant_conv`` output's channels,
  flattened row-major (``[B, h*w]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from dllm_rl.errors import UserError

#: weight files a MAGVIT-v2 checkpoint directory may hold, in the order they are looked for
WEIGHT_FILES = ("model.safetensors", "pytorch_model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class MagvitConfig:
    """Encoder sizes; the defaults are the published ones (``showlab/magvitv2``)."""

    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 2, 2, 4, 4)
    num_res_blocks: tuple[int, ...] = (4, 3, 4, 3, 4)
    z_channels: int = 13
    in_channels: int = 3

    @property
    def codebook_size(self) -> int:
        return 2 ** self.z_channels


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=32, num_channels=channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1, self.conv1 = _norm(cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = _norm(cout), nn.Conv2d(cout, cout, 3, padding=1)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the spatial positions (1x1 convs as projections)."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = _norm(channels)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(channels, channels, 1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        n = self.norm(x)
        q, k, v = (m(n).reshape(b, 1, c, h * w).transpose(-1, -2) for m in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)  # softmax(q k^T / sqrt(c)) v, one head
        return x + self.proj_out(out.transpose(-1, -2).reshape(b, c, h, w))


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))  # the published right/bottom pad (asymmetric)


class Encoder(nn.Module):
    """The VQGAN encoder: pixels ``[B, 3, H, W]`` to ``[B, z, H / 2^(L-1), W / 2^(L-1)]`` (after ``quant_conv``)."""

    def __init__(self, cfg: MagvitConfig):
        super().__init__()
        if len(cfg.ch_mult) != len(cfg.num_res_blocks):
            raise ValueError(f"MagvitConfig: ch_mult {cfg.ch_mult} and num_res_blocks {cfg.num_res_blocks} differ "
                             "in length (one entry per level)")
        self.conv_in = nn.Conv2d(cfg.in_channels, cfg.ch, 3, padding=1)
        self.down = nn.ModuleList()
        width = cfg.ch
        for level, (mult, blocks) in enumerate(zip(cfg.ch_mult, cfg.num_res_blocks)):
            stage = nn.Module()
            stage.block = nn.ModuleList()
            for _ in range(blocks):
                stage.block.append(ResnetBlock(width, cfg.ch * mult))
                width = cfg.ch * mult
            if level != len(cfg.ch_mult) - 1:
                stage.downsample = Downsample(width)
            self.down.append(stage)
        self.mid = nn.Module()
        self.mid.block_1, self.mid.attn_1, self.mid.block_2 = ResnetBlock(width, width), AttnBlock(width), ResnetBlock(
            width, width)
        self.norm_out = _norm(width)
        self.conv_out = nn.Conv2d(width, cfg.z_channels, 3, padding=1)
        self.quant_conv = nn.Conv2d(cfg.z_channels, cfg.z_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for stage in self.down:
            for block in stage.block:
                h = block(h)
            if hasattr(stage, "downsample"):
                h = stage.downsample(h)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        return self.quant_conv(self.conv_out(F.silu(self.norm_out(h))))


def lfq_tables(codebook_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The lookup-free quantiser's fixed buffers: ``embedding`` (code ``i``'s +-1 bits, most significant
    first, ``[2^d, d]`` float) and ``power_vals`` (``2^(d-1-c)``, ``[d]`` int64)."""
    powers = 2 ** torch.arange(codebook_dim - 1, -1, -1)
    bits = (torch.arange(2 ** codebook_dim)[:, None] // powers) % 2
    return bits.float() * 2 - 1, powers


class LookupFreeQuantizer(nn.Module):
    """Codes are the sign bits of each position's channels read as a binary number (no nearest-neighbour
    search): ``code = sum_c [z_c > 0] * 2^(d-1-c)``. The buffers are the published ones, kept so that a
    checkpoint whose tables are not the standard ones is refused at load."""

    def __init__(self, codebook_dim: int):
        super().__init__()
        embedding, powers = lfq_tables(codebook_dim)
        self.register_buffer("embedding", embedding)
        self.register_buffer("power_vals", powers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """``[B, d, h, w]`` to codes ``[B, h*w]`` (int64, row-major)."""
        return ((z > 0).long() * self.power_vals[None, :, None, None]).sum(1).flatten(1)


class MagvitEncoder(nn.Module):
    """Pixels to MAGVIT-v2 codes: ``encoder`` then ``quantize`` (the published module names)."""

    def __init__(self, cfg: MagvitConfig | None = None):
        super().__init__()
        self.cfg = cfg or MagvitConfig()
        self.encoder = Encoder(self.cfg)
        self.quantize = LookupFreeQuantizer(self.cfg.z_channels)

    @torch.no_grad()
    def codes(self, pixels: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, h*w]`` in ``[0, codebook_size)`` of normalised pixels ``[B, 3, H, W]`` (see
        :func:`dllm_rl.models.mmada_image.image_transform`)."""
        return self.quantize(self.encoder(pixels.to(self.encoder.conv_in.weight.dtype)))


def _read_vq_weights(path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    for name in WEIGHT_FILES:
        file = path / name
        if not file.is_file():
            continue
        try:
            if file.suffix == ".bin":  # a pickled state dict: tensors only, nothing executed
                return file, torch.load(file, map_location="cpu", weights_only=True)
            return file, load_file(str(file))
        except (SafetensorError, RuntimeError, EOFError) as exc:
            raise UserError(f"{file}: not a readable checkpoint ({exc}); fetch or save it again") from None
    raise FileNotFoundError(f"{path}: no MAGVIT-v2 weights (looked for {', '.join(WEIGHT_FILES)})")


def load_vq_encoder(path: str | Path, cfg: MagvitConfig | None = None,
                    device: str | torch.device = "cpu") -> MagvitEncoder:
    """The MAGVIT-v2 encoder of a published checkpoint directory (``showlab/magvitv2`` layout), sizes from
    ``cfg`` (default: the published ones). Every ``encoder.*`` / ``quantize.*`` tensor must be present under
    its published name and shape, and the quantiser tables must be the standard ones; ``decoder.*`` is
    ignored. Errors name the tensor and the file."""
    path = Path(path)
    file, weights = _read_vq_weights(path)
    model = MagvitEncoder(cfg)
    want = model.state_dict()
    state = {k: v for k, v in weights.items() if not k.startswith("decoder.")}
    missing = sorted(set(want) - set(state))
    if missing:
        name = missing[0]
        raise UserError(f"{file}: MAGVIT-v2 tensor {name!r} is missing (shape {tuple(want[name].shape)}; "
                        f"{len(missing)} missing in all); is this a showlab/magvitv2 checkpoint of these sizes "
                        "(MagvitConfig)?")
    for name in sorted(state):
        if name not in want:
            raise UserError(f"{file}: unexpected tensor {name!r} for a MAGVIT-v2 encoder of these sizes "
                            "(MagvitConfig); a renamed or different model?")
        if tuple(state[name].shape) != tuple(want[name].shape):
            raise UserError(f"{file}: tensor {name!r} has shape {tuple(state[name].shape)}, MagvitConfig implies "
                            f"{tuple(want[name].shape)}")
    for name in ("quantize.embedding", "quantize.power_vals"):
        if not torch.equal(state[name].to(want[name].dtype), want[name]):
            raise UserError(f"{file}: {name!r} is not the lookup-free quantiser's standard table, so its codes "
                            "are not sign bits; this loader reads MAGVIT-v2 LFQ checkpoints only")
    model.load_state_dict(state, strict=True)
    return model.to(device).eval()


__all__ = ["MagvitConfig", "MagvitEncoder", "load_vq_encoder", "lfq_tables"]
