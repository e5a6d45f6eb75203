"""Every config in configs/ (each variant, and a few overrides) builds the same ConfigDict and
translates to the same spec as the code the snapshot was written from (tests/spec_snapshot.py;
written before the config groups were declared once, issue 40)."""

import pytest

from tests import spec_snapshot

# Errors whose wording changed on purpose since the snapshot, entry -> today's message; each
# still names the knob, the value and what is allowed. A knob declared with its allowed
# values (d1jax.config.groups, ``choices``) is refused in one form: "choose one of ...".
REWORDED: dict[str, str] = {
    "grpo_sudoku.py:tiny+bad_token_mean":
        "ConfigError: grpo.token_mean='batch': choose one of group, step",  # was: group (d1) or step
    "grpo_sudoku.py:tiny+bad_master":
        "ConfigError: optim.master_weights='bfloat16': choose one of float32, none",
    "grpo_sudoku.py:tiny+bad_dtype":  # was: one of ['bfloat16', 'float16', 'float32']
        "ConfigError: model.dtype='float8': choose one of float32, bfloat16, float16",
    "grpo_sudoku.py:tiny+bad_incompatible":
        "ConfigError: train.if_incompatible='ignore': choose one of refuse, move_aside",
    "sft_s1k.py:tiny+bad_tokenize": "ConfigError: sft.tokenize='chat': choose one of joint, split",
    "grpo_sudoku.py:tiny+bad_remasking":  # names the loop since block diffusion has its own
        "ConfigError: sampler.remasking='top' with loop='llada': use one of ('low_confidence', "
        "'random')",
    "grpo_sudoku.py:tiny+bad_family":  # lists the registered families: lladamoe since
        "ConfigError: config.model.family: unknown model family 'gpt'; choose one of llada, "
        "dream, sdar, llada2, lladamoe",
}


# Spec classes renamed on purpose since the snapshot: old name -> new (the config groups'
# specs are all ...Spec; "run" names the package, the stage entry points and RunSpec).
RENAMED = {"GRPORun": "GRPOSpec", "SFTRun": "SFTSpec"}


def renamed(value):
    if isinstance(value, dict) and set(value) == {"class"}:
        return {"class": RENAMED.get(value["class"], value["class"])}
    return value


# One variant syntax since the snapshot (d1jax.config.variants, issue 57): the evaluation
# configs' ':TASK-tiny' is ':TASK,tiny' (recorded under the old spelling), and a variant a
# config refused then (in one of four wordings) is refused in one: "unknown config variant
# '...' for configs/<file>: use comma-separated words from ...".
OLD_REFUSALS = ("unknown config variant", "unknown demo variant", "unknown eval config",
                "unknown variant", "has one size")


def respelled(name: str) -> str:
    file, _, arg = name.partition(":")
    return f"{file}:{arg.replace('-tiny', ',tiny')}" if file.endswith("eval.py") else name


def same_config(name: str, got, want) -> bool:
    if isinstance(want, dict) and any(m in want.get("error", "") for m in OLD_REFUSALS):
        error = got.get("error", "") if isinstance(got, dict) else ""
        return (error.startswith("ConfigError: unknown config variant ")
                and f"configs/{name.partition(':')[0]}: use " in error)
    return got == want


@pytest.fixture(scope="module")
def recorded():
    return {respelled(name): entry for name, entry in spec_snapshot.read().items()}


@pytest.fixture(scope="module")
def today(recorded):
    spec_snapshot.clear_model_paths()
    entries = spec_snapshot.entries()
    assert set(entries) == set(recorded), "config files or variants changed: rewrite the snapshot"
    out = {}
    for name, (path, args, overrides) in entries.items():
        config, c = spec_snapshot.record(path, args, overrides)
        out[name] = (config, c)
    return out


def test_every_config_builds_the_recorded_config_dict(recorded, today):
    for name, (config, _) in today.items():
        assert same_config(name, config, recorded[name]["config"]), name


def test_every_config_translates_to_the_recorded_spec(recorded, today):
    """Each recorded spec path reads the same value today (the spec may have grown fields or
    turned one into a property); a recorded error is raised again, worded the same unless
    REWORDED says otherwise."""
    from d1jax.run import spec as spec_lib
    checked = 0
    for name, (_, c) in today.items():
        want = recorded[name]["spec"]
        if c is None or want is None:  # no config (a refused variant), or not a run config
            assert want is None and (c is None or spec_snapshot.spec_record(c) is None), name
            continue
        if "error" in want:
            got = spec_snapshot.spec_record(c)
            assert got == {"error": REWORDED.get(name, want["error"])}, name
            continue
        spec = spec_lib.from_config(c, weights=False)
        for path, value in want.items():
            got = spec_snapshot.flatten(spec_snapshot.read_path(spec, path), path)[path]
            assert got == renamed(value), f"{name}: {path} was {value}, now {got}"
            checked += 1
    assert checked > 5000  # the comparison ran over every field, not an empty record


def test_the_comparison_sees_a_changed_default(recorded, monkeypatch):
    """A config whose default moved no longer matches its record: the test can fail."""
    from d1jax.run import spec as spec_lib
    name = "grpo_sudoku.py:tiny"
    _, c = spec_snapshot.record(*spec_snapshot.entries()[name])
    with c.unlocked():
        c.grpo.epsilon = 0.25
    assert spec_snapshot.config_record(c) != recorded[name]["config"]
    flat = spec_snapshot.flatten(spec_lib.from_config(c, weights=False))
    assert flat["grpo.epsilon"] != recorded[name]["spec"]["grpo.epsilon"]
