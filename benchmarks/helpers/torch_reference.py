"""The PyTorch reference the training benchmark measures gptlite against.

nanoGPT is not a package that can be installed, so this is a re-implementation,
written for this benchmark, of what nanoGPT's `model.py` and `train.py` do
for Tiny Shakespeare on a CPU: the same model (pre-norm blocks, one fused
Q/K/V projection, `scaled_dot_product_attention`, tanh-free exact GELU, no
biases, tied embedding, N(0, 0.02) weights with the residual projections
scaled by 1/sqrt(2 * n_layer)), the same AdamW (decay on matrices only,
betas 0.9 and beta2, clipping at norm 1.0), warm-up then cosine schedule and
random-window batches; run eagerly (nanoGPT's CPU setting, `--compile=False`).
`precision="bf16"` wraps the forward pass in `torch.autocast(device, bfloat16)`.
On a CUDA device, `compile=True` runs it as nanoGPT's GPU configuration does:
`torch.compile`d, TF32 matmuls, the fused AdamW, batches copied from pinned
memory without waiting.
"""

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional


class SelfAttention(nn.Module):
    def __init__(self, width, heads, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.projection = nn.Linear(width, width, bias=False)
        self.residual_dropout = nn.Dropout(dropout)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)  # each (B, T, C)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        y = functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).reshape(batch, length, width)  # (B, T, C)
        return self.residual_dropout(self.projection(y))


class Block(nn.Module):
    def __init__(self, width, heads, dropout):
        super().__init__()
        self.attention_norm = nn.LayerNorm(width, bias=False)
        self.attention = SelfAttention(width, heads, dropout)
        self.feed_forward_norm = nn.LayerNorm(width, bias=False)
        self.feed_forward = nn.Sequential(
            nn.Linear(width, 4 * width, bias=False), nn.GELU(),
            nn.Linear(4 * width, width, bias=False), nn.Dropout(dropout),
        )

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.feed_forward_norm(x))


class ReferenceGPT(nn.Module):
    def __init__(self, vocab_size, n_layer, n_head, n_embd, block_size, dropout):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, n_embd)
        self.position_embedding = nn.Embedding(block_size, n_embd)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.final_norm = nn.LayerNorm(n_embd, bias=False)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight
        for name, parameter in self.named_parameters():
            if parameter.dim() == 2:
                # Residual projections start smaller, as in GPT-2, so the sum
                # over layers keeps a unit scale.
                residual = name.endswith("projection.weight") or name.endswith("feed_forward.2.weight")
                std = 0.02 / math.sqrt(2 * n_layer) if residual else 0.02
                nn.init.normal_(parameter, 0.0, std)

    def forward(self, token_ids, targets=None):
        length = token_ids.shape[1]
        positions = torch.arange(length, device=token_ids.device)
        x = self.token_embedding(token_ids) + self.position_embedding(positions)  # (B, T, C)
        x = self.dropout(x)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.final_norm(x))  # (B, T, V)
        if targets is None:
            return logits
        return functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def character_splits(text):
    """A text as nanoGPT's character-level data preparation reads it: one id per character, numbered in sorted
    order, the first 90% to train on and the rest to validate. (train ids, validation ids, vocabulary size)."""
    vocabulary = sorted(set(text))
    index = {c: i for i, c in enumerate(vocabulary)}
    ids = np.array([index[c] for c in text], dtype=np.uint16)
    cut = int(len(ids) * 0.9)
    return ids[:cut], ids[cut:], len(vocabulary)


class ReferenceTrainer:
    """One training run: `step()` does one optimizer step, `validation_loss()` evaluates."""

    def __init__(self, train_ids, validation_ids, vocab_size, settings, precision="fp32", seed=1337,
                 device="cpu", compile=False):
        torch.manual_seed(seed)
        self.settings = settings
        self.train_ids, self.validation_ids = train_ids, validation_ids
        self.rng = np.random.default_rng(seed)
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        if cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.model = ReferenceGPT(vocab_size, settings["n_layer"], settings["n_head"], settings["n_embd"],
                                  settings["block_size"], settings["dropout"]).to(self.device)
        matrices = [p for p in self.model.parameters() if p.dim() >= 2]
        vectors = [p for p in self.model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": matrices, "weight_decay": settings["weight_decay"]}, {"params": vectors, "weight_decay": 0.0}],
            lr=settings["lr"], betas=(0.9, settings["beta2"]), fused=cuda,
        )
        # The module that runs; self.model keeps the parameters (and what parameter_count reads).
        self.forward = torch.compile(self.model) if compile else self.model
        self.precision = precision
        self.iteration = 0

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16")

    def _batch(self, ids):
        length, batch_size = self.settings["block_size"], self.settings["batch_size"]
        starts = self.rng.integers(0, len(ids) - length, batch_size)
        windows = torch.from_numpy(np.stack([ids[s: s + length + 1] for s in starts]).astype(np.int64))
        if self.device.type == "cuda":
            windows = windows.pin_memory().to(self.device, non_blocking=True)
        return windows[:, :-1], windows[:, 1:]

    def _learning_rate(self):
        s, i = self.settings, self.iteration
        if i < s["warmup_iters"]:
            return s["lr"] * (i + 1) / (s["warmup_iters"] + 1)
        progress = (i - s["warmup_iters"]) / (s["max_iters"] - s["warmup_iters"])
        return s["min_lr"] + 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))) * (s["lr"] - s["min_lr"])

    def step(self):
        """One optimizer step; its loss as a 0-d tensor (reading it waits for the device)."""
        self.model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = self._learning_rate()
        inputs, targets = self._batch(self.train_ids)
        with self._autocast():
            loss = self.forward(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.iteration += 1
        return loss.detach()

    @torch.no_grad()
    def validation_loss(self, batches, ids=None):
        """The mean loss over `batches` random windows of `ids` (the validation split unless given)."""
        self.model.eval()
        ids = self.validation_ids if ids is None else ids
        losses = []
        for _ in range(batches):
            inputs, targets = self._batch(ids)
            with self._autocast():
                losses.append(self.forward(inputs, targets))
        return torch.stack(losses).mean().item()

    def parameter_count(self):
        # Counted as nanoGPT reports it: without the position table.
        return sum(p.numel() for p in self.model.parameters()) - self.model.position_embedding.weight.numel()
