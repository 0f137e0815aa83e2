"""FSDP2 units over tied parameters (DiffusionGemma: encoder layer i and decoder layer i are twins over the same
weights, as are the two embeddings, the LM head and the two final norms), for every model the trainers prepare.

- :func:`group_tied_units` / :func:`grouping_tied_units`: shard modules that share parameters as one unit each
  (``fully_shard([encoder_layer, decoder_layer])``), and what the root unit would hold alone (final norms,
  self-conditioning block, vision patch embedder) as units of their own; then make the model FSDP2's root.
- :func:`separate_passes`: each call of a unit's member is a forward pass of that unit of its own, and the keys
  and values an encoder layer leaves in a cache gather its unit again before their backward, so scorers that call
  the encoder once and the decoder many times (with or without gradient: self-conditioning) stay exact and sharded.

Hand-written because accelerate's FSDP2 preparation shards one module per policy match and has no hook for groups,
and FSDP2's group bookkeeping assumes every member runs once per forward. The FSDP2 internals read here
(``FSDPState._modules_to_run_forward``, ``_training_state``, ``_pre_backward``, ``_lazy_init``) are checked by
``tests/scale/test_tied_units.py``: a torch that renames them fails that test, not a training run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from accelerate import Accelerator


def _tied_groups(model: torch.nn.Module, is_unit) -> dict[int, list[torch.nn.Module]]:
    """The would-be units of ``model`` that share a parameter, grouped (by ``id`` of each member): DiffusionGemma's
    encoder layer i and decoder layer i, twins over tied weights."""
    owner: dict[int, torch.nn.Module] = {}
    groups: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        if not is_unit(module):
            continue
        for param in module.parameters():
            first = owner.setdefault(id(param), module)
            group = groups.setdefault(id(first), [first])
            if first is not module and module not in group:
                group.append(module)
                groups[id(module)] = group
    return {key: group for key, group in groups.items() if len(group) > 1}


def _own_parameters(module: torch.nn.Module) -> Iterator[torch.nn.Parameter]:
    """The parameters of ``module`` outside the FSDP units below it (those a ``fully_shard(module)`` would take)."""
    from torch.distributed.fsdp import FSDPModule

    below = {id(p) for m in module.modules() if m is not module and isinstance(m, FSDPModule) for p in m.parameters()}
    return (p for p in module.parameters() if id(p) not in below)


def _with_tied_owners(model: torch.nn.Module, members: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """``members`` plus every other module of ``model`` that holds one of their parameters itself (DiffusionGemma's
    decoder embedding and final norm, tied to the encoder's, when accelerate shards the embedding and the final
    norm as its tail unit)."""
    inside = {id(m) for member in members for m in member.modules()}
    params = {id(p) for member in members for p in _own_parameters(member)}
    extra = [m for m in model.modules() if id(m) not in inside
             and any(id(p) in params for p in m.parameters(recurse=False))]
    return [*members, *extra]


def _reader_classes() -> tuple[str, ...]:
    from dllm_rl.models.families import FAMILIES

    return tuple(dict.fromkeys(name for fam in FAMILIES.values() for name in fam.fsdp_reader_units))


def _readers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of ``model`` of a ``Family.fsdp_reader_units`` class."""
    names = _reader_classes()
    return [m for m in model.modules() if type(m).__name__.removeprefix("FSDP") in names]


def _with_readers(model: torch.nn.Module, members: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """``members`` with each one that lies inside a reader module (``Family.fsdp_reader_units``: DiffusionGemma's
    decoder, which reads its embedding matrix outside the embedding's call) replaced by that reader, which then
    gathers it for its whole forward."""
    readers = _readers(model)
    out: list[torch.nn.Module] = []
    for member in members:
        holder = next((r for r in readers if any(m is member for m in r.modules())), member)
        if all(holder is not m for m in out):
            out.append(holder)
    return out


def _root_leftovers(model: torch.nn.Module) -> list[list[torch.nn.Module]]:
    """The modules of ``model`` outside every unit that hold parameters themselves (DiffusionGemma's final norms, its
    self-conditioning block, the vision tower's patch embedder), grouped where they share one (the two final norms).
    In the root unit their parameters would be gathered only by the root's forward, which a model whose scorers call
    its stacks directly (DiffusionGemma's encoder cache) never runs: as units of their own they gather when called."""
    from torch.distributed.fsdp import FSDPModule

    inside = {id(m) for unit in model.modules() if unit is not model and isinstance(unit, FSDPModule)
              for m in unit.modules()}

    def holds(module: torch.nn.Module) -> bool:
        return module is not model and id(module) not in inside and next(module.parameters(False), None) is not None

    groups: dict[int, list[torch.nn.Module]] = {}  # by id of a parameter: the group holding it
    out: list[list[torch.nn.Module]] = []
    for module in model.modules():  # parents first; a unit takes its whole subtree's parameters
        if not holds(module):
            continue
        group = next((groups[id(p)] for p in module.parameters(False) if id(p) in groups), None)
        if group is None:
            group = []
            out.append(group)
        group.append(module)
        groups.update((id(p), group) for p in module.parameters(False))
        inside.update(id(m) for m in module.modules())
    return out


def _cache_tensors(args, kwargs) -> list[torch.Tensor]:
    """The key and value tensors of every transformers ``Cache`` among a call's arguments."""
    from transformers.cache_utils import Cache

    caches = [a for a in (*args, *kwargs.values()) if isinstance(a, Cache)]
    return [t for cache in caches for layer in cache.layers for t in (getattr(layer, "keys", None),
                                                                      getattr(layer, "values", None))
            if isinstance(t, torch.Tensor)]


def separate_passes(members: list[torch.nn.Module]) -> None:
    """Make each call of a member of the unit ``members`` (a twin pair, or one module) a forward pass of its own.

    FSDP2 counts a group's forward complete when every member has run once: only then does it reshard and register
    the pre-backward gather (on the output of the member that completed it), and it registers the post-backward
    reduce-scatter only on the inputs of the member that opened it. The uniform-state scorers call encoder twin i
    once per canvas and decoder twin i once per denoising step, some without gradient (self-conditioning's first
    pass): the pass that a no-grad decoder call completes leaves the grad call of the decoder a new, partial pass,
    whose post-backward reshards the unit before the encoder's backward reads it (a segfault), and a partial pass
    keeps its unit gathered through the whole encoder. Here every member call gathers, reshards after, gathers again
    at its output's backward and reduce-scatters after its inputs' (FSDP2 accumulates each reduce-scatter into the
    sharded gradient, as for any unit called more than once). The encoder's backward is also reached through the
    keys and values it leaves in the cache, not only through its output: those tensors (the ones the call replaced
    in a ``Cache`` argument) gather the unit before their backward too."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    state = members[0]._get_fsdp_state()
    before: dict[int, list[torch.Tensor]] = {}  # held during a call, so no new tensor can take an old one's id

    def pre(module, args, kwargs):
        if state._training_state != TrainingState.FORWARD:  # no pass open: this member alone makes the next one
            state._modules_to_run_forward.clear()
            state._modules_to_run_forward.add(module)
        if torch.is_grad_enabled():
            before[id(module)] = _cache_tensors(args, kwargs)

    def post(module, args, kwargs, output):
        held = before.pop(id(module), None)
        if held is not None and torch.is_grad_enabled():
            seen = {id(t) for t in held}
            for t in _cache_tensors(args, kwargs):
                if t.requires_grad and id(t) not in seen:
                    t.register_hook(state._pre_backward)

    for member in members:  # before FSDP2's own hooks (prepend): the pass is set before it reads it
        member.register_forward_pre_hook(pre, prepend=True, with_kwargs=True)
        member.register_forward_hook(post, with_kwargs=True)


@contextlib.contextmanager
def grouping_tied_units(plugin, model: torch.nn.Module) -> Iterator[None]:
    """Inside, FSDP2's ``fully_shard`` shards modules that share parameters as one unit: a unit with tied twins
    together with them (``fully_shard([encoder_layer, decoder_layer])``, the form FSDP2 asks for: a parameter may
    belong to one group only, and each twin alone fails its lazy init with "shared with a parameter already managed
    by another FSDP group"), any other unit with the modules that hold its parameters elsewhere, and what the root
    would hold as units of their own (:func:`_root_leftovers`); a module that reads a parameter outside its holder's
    call (``Family.fsdp_reader_units``) is one unit with it (:func:`_with_readers`). On exit the model is made FSDP2's
    root (below) and each unit's members run passes of their own (:func:`separate_passes`). The patch lives only while
    accelerate prepares ``model``, and changes nothing for a model without tied twins or reader units."""
    import torch.distributed.fsdp as fsdp
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    plugin.set_auto_wrap_policy(model)
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    groups = {} if policy is None else _tied_groups(model, policy)
    if not groups and not _readers(model) or policy is None:
        yield
        return
    original = fsdp.fully_shard
    units: list[list[torch.nn.Module]] = []

    def shard(members: list[torch.nn.Module], readers: bool = True, **kwargs) -> None:
        members = _with_tied_owners(model, members)
        if readers:  # the tied holders too may lie inside a reader (the decoder's embedding)
            members = _with_tied_owners(model, _with_readers(model, members))
        if not (members := [m for m in members if not isinstance(m, fsdp.FSDPModule)]):
            return
        original(members, **kwargs)
        units.append(members)

    def fully_shard(module, **kwargs):
        if module is model:  # accelerate shards the root last: what it would hold goes into units first
            for reader in _readers(model):
                if not isinstance(reader, fsdp.FSDPModule):
                    shard([reader], **kwargs)
            for leftovers in _root_leftovers(model):
                shard(leftovers, **kwargs)
            return original(module, **kwargs)
        if isinstance(module, fsdp.FSDPModule):  # a twin its group's first member has sharded
            return module
        if id(module) in groups:
            shard(groups[id(module)], readers=False, **kwargs)
            return module
        if isinstance(module, (list, tuple)) or not policy(module):  # accelerate's embedding / tail units
            shard(list(module) if isinstance(module, (list, tuple)) else [module], **kwargs)  # with their readers
        else:
            shard([module], readers=False, **kwargs)
        return module

    fsdp.fully_shard = fully_shard
    try:
        yield
    finally:
        fsdp.fully_shard = original
    if isinstance(model, fsdp.FSDPModule):
        # FSDP2 makes the first unit to run a forward its root (lazy init), and fails when that unit is a group
        # ("requires a single root module"), as the estimators' first call (the tail unit's embedding) is. Made
        # root here, the model's state is shared by every unit, so each unit called directly gathers and
        # reduce-scatters as in the model's own forward. Private: FSDP2 has no public call for it.
        model._get_fsdp_state()._lazy_init()
        for members in units:
            separate_passes(members)


def group_tied_units(accelerator: Accelerator) -> None:
    """Make ``accelerator``'s FSDP2 preparation shard units that share parameters as one unit each
    (:func:`grouping_tied_units`; DiffusionGemma's encoder/decoder twins), for every model it prepares (the
    policy, the value model; the reference goes through ``backend.shard_reference``). Once per accelerator."""
    if getattr(accelerator, "_dllm_tied_units", False):
        return
    original = accelerator._prepare_fsdp2

    def prepare(*args):
        with contextlib.ExitStack() as stack:
            for obj in args:
                if isinstance(obj, torch.nn.Module):
                    stack.enter_context(grouping_tied_units(accelerator.state.fsdp_plugin, obj))
            return original(*args)

    accelerator._prepare_fsdp2 = prepare
    accelerator._dllm_tied_units = True
