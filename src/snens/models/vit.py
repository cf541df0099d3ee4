"""A small pre-norm Vision Transformer (Dosovitskiy et al., 2021) for 32×32 images."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Attention", "Block", "Mlp", "VisionTransformer", "vit_small"]

NormLayer = Callable[[int], nn.Module]


class Attention(nn.Module):
    """Multi-head self-attention: softmax(Q Kᵀ / √d_head) V over all tokens, (B, N, D) → (B, N, D).

    Raises:
        ValueError: ``dim`` is not divisible by ``num_heads``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_dropout: float = 0.0,
        proj_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.attn_dropout = attn_dropout
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_dropout = nn.Dropout(proj_dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, N, D/H)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_dropout if self.training else 0.0
        )
        out = out.transpose(1, 2).reshape(b, n, d)  # (B, N, D)
        return self.proj_dropout(self.proj(out))


class Mlp(nn.Module):
    """Token-wise MLP: Linear(D, hidden), GELU, dropout, Linear(hidden, D), dropout."""

    def __init__(self, dim: int, hidden_dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.fc2(self.dropout(self.act(self.fc1(x)))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        norm_layer: NormLayer = nn.LayerNorm,
    ) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads, attn_dropout=attn_dropout, proj_dropout=dropout)
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """Pre-norm ViT with a class token and learned position embeddings.

    Raises:
        ValueError: ``image_size`` not divisible by ``patch_size`` or ``dim`` by ``num_heads``;
            at call time, an input size other than ``image_size``.
    """

    def __init__(
        self,
        num_classes: int = 10,
        image_size: int = 32,
        patch_size: int = 4,
        in_channels: int = 3,
        dim: int = 384,
        depth: int = 6,
        num_heads: int = 6,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        norm_layer: NormLayer = nn.LayerNorm,
    ) -> None:
        super().__init__()
        if image_size % patch_size != 0:
            raise ValueError(
                f"image_size={image_size} must be divisible by patch_size={patch_size}"
            )
        self.image_size = image_size
        num_patches = (image_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, dim))
        self.pos_dropout = nn.Dropout(dropout)
        block = (dim, num_heads, mlp_ratio, dropout, attn_dropout, norm_layer)
        self.blocks = nn.Sequential(*(Block(*block) for _ in range(depth)))
        self.norm = norm_layer(dim)
        self.head = nn.Linear(dim, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        # ViT/timm initialization
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-2:] != (self.image_size, self.image_size):
            raise ValueError(
                f"expected {self.image_size}×{self.image_size} images, got input of shape "
                f"{tuple(x.shape)}; build the model with image_size={x.shape[-1]}"
            )
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, N, D), N = (S / P)²
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embed  # (B, N + 1, D)
        x = self.norm(self.blocks(self.pos_dropout(x)))
        return self.head(x[:, 0])  # class token -> (B, K)


def vit_small(
    num_classes: int = 10, image_size: int = 32, patch_size: int = 4, in_channels: int = 3, **kwargs
) -> VisionTransformer:
    """ViT for 32×32 images: D=384, 6 blocks, 6 heads, MLP ×4; 10,695,562 parameters at K=10.

    Returns:
        A new :class:`VisionTransformer`.

    Raises:
        ValueError: as :class:`VisionTransformer`.
    """
    return VisionTransformer(num_classes, image_size, patch_size, in_channels, **kwargs)
