"""Prints every knob of the run configs (``d1jax.config.groups``) as Markdown: the text of
docs/configs.md, which tests/test_knobs.py keeps equal to it.

    python -m d1jax.config > docs/configs.md
"""

from d1jax.config import defaults, groups, knobs

# config group -> its declaration, in the order the builders assemble them.
GROUPS = (("model", groups.ModelKnobs), ("lora", groups.LoraKnobs), ("optim", groups.OptimKnobs),
          ("train", groups.LoopSpec), ("task", groups.TaskKnobs), ("mesh", groups.MeshKnobs),
          ("sampler", groups.SamplerKnobs), ("grpo", groups.GRPOKnobs), ("sft", groups.SFTKnobs),
          ("eval", groups.EvalKnobs))

# Groups whose run defaults a builder sets over the declared ones: group -> (tiny -> its
# ConfigDict). The sampler's are the rollouts' (d1's train.yaml), SamplerConfig's d1's eval's.
MADE_BY = {"sampler": defaults.sampler_fields}

HEADER = """# Config knobs

Every knob of the run configs, generated from its one declaration by `python -m d1jax.config >
docs/configs.md` (`tests/test_knobs.py` fails when this file and the code disagree). A knob the
library's pure functions take is declared on their config (`SamplerConfig`, `GRPOConfig`,
`SFTConfig`, `LoraConfig`, the objectives' configs), the run's own in `d1jax/config/groups.py`;
each group below names where its knobs are declared. Each group's knobs, defaults and types
make both the ConfigDict a config file starts from (`d1jax/config/defaults.py`, whose builders
then set what depends on the task, objective or checkpoint: see each config file's docstring)
and the typed spec a run reads (`d1jax/run/spec.py`). "tiny" is the `:tiny` variant's value
where it differs. Top-level fields (`stage`, `workdir`, `seed`, `max_prompt_length`) are
commented in `d1jax/config/defaults.py` (`base`). Override any knob with
`--config.GROUP.KNOB=value`.
"""


def _cell(value) -> str:
    return f"`{value!r}`".replace("|", "\\|")


def _type(f) -> str:
    kind = f.metadata["kind"] or f.type
    if isinstance(kind, tuple):
        return " or ".join(getattr(k, "__name__", str(k)) for k in kind).replace("NoneType", "None")
    if not getattr(kind, "__args__", None):
        return kind.__name__
    return str(kind).replace("NoneType", "None").replace(" | ", " or ")


def _declared(cls) -> str:
    """Which library configs declare knobs of ``cls`` (the others are the group's own)."""
    where: dict[str, list[str]] = {}
    own = 0
    for f in knobs.fields(cls):
        owner = f.metadata.get("from")
        if owner is not None:
            where.setdefault(f"{owner.__module__}.{owner.__qualname__}", []).append(f.name)
        own += owner is None and "group" not in f.metadata
    if not where:
        return ""
    if len(where) == 1 and not own:
        return f" Declared on `{next(iter(where))}`."
    return " " + "; ".join(f"`{k}` declares {', '.join(v)}" for k, v in where.items()) + "."


def _rows(cls, prefix: str, made_by=None) -> list[str]:
    rows = []
    made = {tiny: made_by(tiny) for tiny in (False, True)} if made_by else None
    for f in knobs.fields(cls):
        doc = f.metadata["doc"].replace("|", "\\|")
        if "group" in f.metadata:
            rows.append(f"| `{prefix}{f.name}` | group | | | {doc}"
                        f"{_declared(f.metadata['group'])} |")
            rows += _rows(f.metadata["group"], f"{prefix}{f.name}.")
            continue
        default, tiny = f.metadata["default"], f.metadata["tiny"]
        if made is not None:  # the builder's, where it sets them (see MADE_BY)
            default, tiny = made[False].get(f.name, default), made[True].get(f.name, tiny)
        allowed = f" One of {', '.join(map(str, f.metadata['choices']))}." \
            if f.metadata["choices"] else ""
        if f.metadata.get("low") is not None:
            allowed += f" At least {f.metadata['low']}."
        if f.metadata.get("high") is not None:
            allowed += f" At most {f.metadata['high']}."
        rows.append(f"| `{prefix}{f.name}` | {_type(f)} | {_cell(default)} | "
                    f"{_cell(tiny) if tiny != default else ''} | {doc}{allowed} |")
    return rows


def reference() -> str:
    out = [HEADER]
    for name, cls in GROUPS:
        out += [f"## config.{name}", "", " ".join(cls.__doc__.split()) + _declared(cls),
                "", "| knob | type | default | tiny | meaning |", "|---|---|---|---|---|"]
        out += _rows(cls, "", MADE_BY.get(name)) + [""]
    return "\n".join(out).replace("``", "`")


if __name__ == "__main__":
    print(reference(), end="")
