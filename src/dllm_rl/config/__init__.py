"""Typed configuration: dataclasses loaded from YAML with ``a.b=c`` command-line overrides.

Every field is a dataclass field whose ``metadata["help"]`` says what it does (and, for a paper's knob,
the paper's name for it), following TRL's ``GRPOConfig``. Unknown keys are rejected with the closest
valid names; the resolved config is written next to every run (``save_config``) and reloads to an equal
object. The modules, by job:

- :mod:`~dllm_rl.config.fields`: declaring a field (help, ranges, choices, rules) and checking it;
- :mod:`~dllm_rl.config.yaml_io`: the one bounded YAML reader;
- :mod:`~dllm_rl.config.loading`: coercion, building, overrides, renamed keys, saving;
- :mod:`~dllm_rl.config.reference`: ``--help-config`` and the generated reference in ``docs/config.md``;
- :mod:`~dllm_rl.config.command`: the one command front end (``COMMAND [CONFIG.yaml] [key=value] [--key value]``);
- :mod:`~dllm_rl.config.vocabulary`: the shared keys' one vocabulary (device, dtype, tokenizer).
"""

from dllm_rl.config.fields import (
    Checked,
    ConfigError,
    FieldError,
    allowed_values,
    check_fields,
    field,
)
from dllm_rl.config.loading import (
    apply_override,
    as_overrides,
    coerce,
    from_dict,
    load_command_config,
    load_config,
    save_config,
    to_dict,
)
from dllm_rl.config.reference import describe
from dllm_rl.config.yaml_io import YAML_MAX_DEPTH, YAML_MAX_NODES, yaml_load

__all__ = ["YAML_MAX_DEPTH", "YAML_MAX_NODES", "Checked", "ConfigError", "FieldError", "allowed_values",
           "apply_override", "as_overrides", "check_fields", "coerce", "describe", "field", "from_dict",
           "load_command_config", "load_config", "save_config", "to_dict", "yaml_load"]
