"""Tree rollouts (d-TreeRPO, Pan et al. 2025, arXiv 2512.09675, its tree-rollout section): a prompt's completions
grow as a tree of partial decodes, each child continuing its parent's state with fresh randomness.

Shape (:class:`TreeShape`): the root (the prompt, fully masked completion) has ``root`` children (the paper's M),
every other inner node ``branch`` children (T), and the tree has ``depth`` levels of edges (the contraction factor
s): ``root * branch**(depth - 1)`` leaves, ``root * (1 + branch + ... + branch**(depth - 1))`` non-root nodes. Each
non-root node is one training sample (the segment from its parent's state to its own); the samples of a prompt are
laid out level by level, so every node's siblings are consecutive and its parent is
``offset(level - 1) + (index in level) // branch``.

Where a level ends: level ``l`` of ``d`` decodes the blocks ``[floor(l n / d), floor((l + 1) n / d))`` of a row's
``n`` decoded blocks (:func:`until_block`). The released code branches at the global steps
``N - int(k N / s)``; with a static schedule of ``steps`` per block those are block boundaries whenever ``s``
divides the number of blocks (the released recipe: 256 tokens in 8 blocks of 32, 128 steps, ``s = 2``: steps 128,
64, 0), and there the two agree. Otherwise we branch at the nearest block boundary below (a deviation: the
sampler resumes a prefilled state at a block's start, never inside one).

Values and advantages (bottom-up, the released code's ``_perform_tree_search_and_compute_advantages``): a leaf's
value is its reward, an inner node's the mean of its children's (:func:`node_values`); a node's advantage is
its value minus the mean of its siblings' values, the leave-one-out baseline, without any scaling
(:func:`sibling_advantages` with the ``leave_one_out`` rule and ``scale_rewards=none``; another advantage rule is
applied to each sibling group the same way). A node without siblings has advantage = its value (the released code).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dllm_rl.rl.advantages import compute_advantages
from dllm_rl.sampling import Rollout


@dataclass(frozen=True)
class TreeShape:
    """A tree rollout's shape: ``root`` children of the root (M), ``branch`` children of every other inner node
    (T), ``depth`` levels of edges (s); see the module docstring for the node layout."""

    root: int
    branch: int
    depth: int

    def __post_init__(self) -> None:
        if self.root < 1 or self.branch < 1 or self.depth < 1:
            raise ValueError(f"a tree needs root >= 1, branch >= 1 and depth >= 1, got {self.root}, {self.branch} "
                             f"and {self.depth}")

    def level_size(self, level: int) -> int:
        """Nodes at ``level`` (0: the root's children)."""
        return self.root * self.branch ** level

    def offset(self, level: int) -> int:
        """Index of the first node of ``level`` in a prompt's samples."""
        return sum(self.level_size(m) for m in range(level))

    @property
    def samples(self) -> int:
        """Non-root nodes, i.e. training samples, per prompt: ``M (1 + T + ... + T^(s-1))``."""
        return self.offset(self.depth)

    @property
    def leaves(self) -> int:
        return self.level_size(self.depth - 1)

    def parent(self, node: int) -> int:
        """The parent's index among a prompt's samples (-1: the root)."""
        level = self.level_of(node)
        if level == 0:
            return -1
        return self.offset(level - 1) + (node - self.offset(level)) // self.branch

    def level_of(self, node: int) -> int:
        for level in range(self.depth):
            if node < self.offset(level + 1):
                return level
        raise ValueError(f"node {node} is not in a tree of {self.samples} non-root nodes")

    def sibling_groups(self) -> list[range]:
        """Each parent's children, as index ranges among a prompt's samples (consecutive by the layout)."""
        groups = [range(0, self.root)]
        for level in range(1, self.depth):
            start = self.offset(level)
            groups += [range(g, g + self.branch) for g in range(start, start + self.level_size(level), self.branch)]
        return groups


def until_block(num_blocks: int, depth: int, level: int) -> int:
    """How many of a row's ``num_blocks`` decoded blocks are decoded once tree level ``level`` (of ``depth``)
    is done: ``floor((level + 1) num_blocks / depth)`` (see the module docstring)."""
    return (level + 1) * num_blocks // depth


def node_values(shape: TreeShape, leaf_rewards: torch.Tensor) -> torch.Tensor:
    """``[P, S]`` node values from leaf rewards ``[P, leaves]`` (d-TreeRPO, bottom-up): a leaf's value is its reward,
    an inner node's the mean of its children's."""
    if leaf_rewards.dim() != 2 or leaf_rewards.shape[1] != shape.leaves:
        raise ValueError(f"leaf rewards: expected [prompts, {shape.leaves}], got {tuple(leaf_rewards.shape)}")
    levels = [leaf_rewards.float()]
    for _ in range(shape.depth - 1):
        below = levels[0]
        levels.insert(0, below.view(below.shape[0], -1, shape.branch).mean(-1))
    return torch.cat(levels, dim=1)


def sibling_advantages(shape: TreeShape, values: torch.Tensor, rule: str = "leave_one_out",
                       scale_rewards: str = "none", options: dict | None = None) -> torch.Tensor:
    """``[P, S]`` advantages: advantage rule ``rule`` (:data:`dllm_rl.rl.advantages.ADVANTAGES`) applied to each
    sibling group's values. d-TreeRPO's local advantage is ``leave_one_out`` with ``scale_rewards=none``:
    ``A_i = V_i - mean_{j sibling of i, j != i} V_j``; a node without siblings keeps ``A_i = V_i``."""
    out = torch.zeros_like(values, dtype=torch.float32)
    for group in shape.sibling_groups():
        cols = list(group)
        v = values[:, cols].float()
        if len(cols) == 1:
            out[:, cols] = v
        else:
            out[:, cols] = compute_advantages(rule, v.reshape(-1), len(cols), scale_rewards, options).view(v.shape)
    return out


@dataclass
class Tree:
    """A batch's tree rollouts: ``nodes`` (``P * S`` rows, prompt by prompt in the layout of :class:`TreeShape`),
    each row the segment its node decoded: its completion with the parent's tokens prefilled (``step_map`` -1)
    and its own tokens stamped with the step of this node's decode that committed them (the EOS a stopped row is
    filled with: its last step); ``committed`` ``[P * S, W]`` the completion slots set in each node's state."""

    shape: TreeShape
    nodes: Rollout
    committed: torch.Tensor

    def leaf_rows(self) -> list[int]:
        s, first, n = self.shape.samples, self.shape.offset(self.shape.depth - 1), self.shape.leaves
        return [p * s + first + k for p in range(len(self.nodes) // s) for k in range(n)]


#: ``decode(samples, prefill, until_block) -> Rollout``: decode samples ``samples`` (indices among the ``P * S``
#: tree nodes) with ``prefill[k]`` (completion offset -> token) committed first, up to ``until_block[k]`` blocks.
Decode = Callable[[list[int], list[dict[int, int]], list[int]], Rollout]


def grow_tree(decode: Decode, shape: TreeShape, num_blocks: list[int], slots: list[int], mask_id: int) -> Tree:
    """Grow one tree per prompt, level by level (d-TreeRPO's tree rollout; the released ``_generate_partial``):
    every node of level ``l`` is decoded by ``decode`` from its parent's state (the root: the masked completion),
    prefilled with the parent's committed tokens, up to the end of level ``l`` (:func:`until_block` of its prompt's
    ``num_blocks``). ``slots[p]`` is prompt ``p``'s number of completion slots, ``mask_id`` the model's mask token
    (a slot still holding it after a decode is not committed). A level's nodes of every prompt are
    decoded in one call; each node's tokens depend only on its parent's state and its own seed (the sampler's
    batch invariance), so a leaf is what the sampler gives for its parent's state and its seed."""
    s = shape.samples
    n_prompts = len(num_blocks)
    rows: dict[int, Rollout] = {}
    committed: dict[int, torch.Tensor] = {}
    for level in range(shape.depth):
        first = shape.offset(level)
        nodes = [(p, first + k) for p in range(n_prompts) for k in range(shape.level_size(level))]
        parents = [shape.parent(k) for _, k in nodes]
        prefill = [{} if q < 0 else {int(j): int(rows[p * s + q].completion_ids[0, j])
                                     for j in committed[p * s + q].nonzero().flatten().tolist()}
                   for (p, _), q in zip(nodes, parents)]
        until = [until_block(num_blocks[p], shape.depth, level) for p, _ in nodes]
        out = decode([p * s + k for p, k in nodes], prefill, until)
        for r, ((p, k), q) in enumerate(zip(nodes, parents)):
            row = out.select(r)
            width = row.completion_ids.shape[1]
            inside = torch.arange(width, device=row.completion_ids.device) < slots[p]
            before = _fit(committed[p * s + q], width) if q >= 0 else torch.zeros_like(inside)
            step = row.step_map[0].clone()
            filled = inside & ~before & (step < 0) & (row.completion_ids[0] != mask_id)
            step[filled] = max(int(row.nfe[0]) - 1, 0)
            row.step_map = step[None]
            rows[p * s + k] = row
            committed[p * s + k] = inside & (before | (step >= 0))
    order = range(n_prompts * s)
    nodes_out = Rollout.cat([rows[i] for i in order])
    width = nodes_out.completion_ids.shape[1]
    return Tree(shape, nodes_out, torch.stack([_fit(committed[i], width) for i in order]))


def _fit(flags: torch.Tensor, width: int) -> torch.Tensor:
    """``flags`` cut or padded with False to ``width`` (rows of different decode calls differ in width)."""
    return torch.nn.functional.pad(flags[:width], (0, max(0, width - len(flags))))

