"""Prints every knob of the run configs (``d1jax.config.groups``) as Markdown: the text of
docs/configs.md, which tests/test_knobs.py keeps equal to it.

    python -m d1jax.config > docs/configs.md
"""

from d1jax.config import groups, knobs

# config group -> its declaration, in the order the builders assemble them.
GROUPS = (("model", groups.ModelKnobs), ("lora", groups.LoraKnobs), ("optim", groups.OptimKnobs),
          ("train", groups.LoopSpec), ("task", groups.TaskKnobs), ("mesh", groups.MeshKnobs),
          ("sampler", groups.SamplerKnobs), ("grpo", groups.GRPOKnobs), ("sft", groups.SFTKnobs),
          ("eval", groups.EvalKnobs))

HEADER = """# Config knobs

Every knob of the run configs, generated from its one declaration in
`d1jax/config/groups.py` by `python -m d1jax.config > docs/configs.md` (`tests/test_knobs.py`
fails when this file and the code disagree). Each group's knobs, defaults and types make both
the ConfigDict a config file starts from (`d1jax/config/defaults.py`, whose builders then set
what depends on the task, objective or checkpoint: see each config file's docstring) and the
typed spec a run reads (`d1jax/run/spec.py`). "tiny" is the `:tiny` variant's value where it
differs. Top-level fields (`stage`, `workdir`, `seed`, `max_prompt_length`) are commented in
`d1jax/config/defaults.py` (`base`). Override any knob with `--config.GROUP.KNOB=value`.
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


def _rows(cls, prefix: str) -> list[str]:
    rows = []
    for f in knobs.fields(cls):
        doc = f.metadata["doc"].replace("|", "\\|")
        if "group" in f.metadata:
            rows.append(f"| `{prefix}{f.name}` | group | | | {doc} |")
            rows += _rows(f.metadata["group"], f"{prefix}{f.name}.")
            continue
        default, tiny = f.metadata["default"], f.metadata["tiny"]
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
        out += [f"## config.{name}", "", " ".join(cls.__doc__.split()), "",
                "| knob | type | default | tiny | meaning |", "|---|---|---|---|---|"]
        out += _rows(cls, "") + [""]
    return "\n".join(out).replace("``", "`")


if __name__ == "__main__":
    print(reference(), end="")
