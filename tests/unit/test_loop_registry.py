"""Loops are registered with the worker by name: SHEPHERD_LOOPS, entry points, built ins.
A spec only names a loop; whatever goes wrong loading it is a LoopLoadError that says what
to fix, never a crash of the worker. And the built-in SFT datum trains completions only."""

from __future__ import annotations

import asyncio
import itertools
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from localplane.trainer.lm import EOS, write_tokenizer_dir
from shepherd import datasets
from shepherd.loops import (
    ENTRY_POINT_GROUP,
    ENV_VAR,
    LoopContext,
    LoopLoadError,
    Supervised,
    registered,
    resolve,
    to_datum,
)

_names = itertools.count()


def _module(directory: Path, source: str) -> str:
    """Write a module under a fresh name (imports are cached per name); return the name."""
    name = f"user_loop_{next(_names)}"
    (directory / f"{name}.py").write_text(textwrap.dedent(source))
    return name


def _ctx() -> LoopContext:
    return LoopContext(
        training_client=None,
        dataset="synthetic:text",
        batch_size=4,
        micro_batches=1,
        seed=3,
        learning_rate=0.01,
        max_context_length=64,
        validation_split=0.1,
        total_steps=10,
    )


FUNCTION_LOOP = """
    async def train(ctx, step):
        return float(step) * 2 + ctx.seed
"""

OBJECT_LOOP = """
    class Policy:
        async def step(self, ctx, step):
            return -float(step)

        async def evaluate(self, ctx):
            return {"reward": 0.5}

    loop = Policy()
"""


# ------------------------------------------------------------------------ SHEPHERD_LOOPS


def test_env_entries_are_parsed_with_spaces_and_empty_items() -> None:
    refs = registered({ENV_VAR: " a=pkg.mod:attr , b-2=/abs/dir/file.py:loop,, "})
    assert refs["a"] == "pkg.mod:attr"
    assert refs["b-2"] == "/abs/dir/file.py:loop"
    assert refs["supervised"] == "built in"


@pytest.mark.parametrize(
    "entry",
    [
        "no-equals-sign",  # no name
        "=pkg.mod:attr",  # empty name
        "Upper=pkg.mod:attr",  # names are lower case
        "9lives=pkg.mod:attr",  # and start with a letter
        "a=pkg.mod",  # no attribute
        "a b=pkg.mod:attr",  # no spaces in names
    ],
)
def test_bad_env_entries_are_refused_naming_the_variable(entry: str) -> None:
    with pytest.raises(LoopLoadError) as err:
        registered({ENV_VAR: f"ok=pkg.mod:attr,{entry}"})
    assert ENV_VAR in str(err.value)
    assert repr(entry) in str(err.value)


def test_unknown_name_is_refused_naming_how_to_register(tmp_path: Path) -> None:
    env = {ENV_VAR: f"mine={tmp_path}/loop.py:loop"}
    with pytest.raises(LoopLoadError) as err:
        resolve("not-registered", env)
    message = str(err.value)
    assert "'not-registered'" in message and ENV_VAR in message and ENTRY_POINT_GROUP in message
    assert "mine" in message and "supervised" in message  # what this worker does know


# --------------------------------------------------------------------------- loading


async def test_a_function_loop_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "fn_loop.py"
    path.write_text(textwrap.dedent(FUNCTION_LOOP))
    loop = resolve("fn", {ENV_VAR: f"fn={path}:train"})
    assert await loop.step(_ctx(), 5) == 13.0
    assert not hasattr(loop, "evaluate")  # a bare function has no evaluation of its own


async def test_an_object_loop_from_a_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    module = _module(tmp_path, OBJECT_LOOP)
    loop = resolve("policy", {ENV_VAR: f"policy={module}:loop"})
    assert await loop.step(_ctx(), 4) == -4.0
    assert await loop.evaluate(_ctx()) == {"reward": 0.5}
    # The registered object itself, not a copy: it may keep state between calls.
    assert resolve("policy", {ENV_VAR: f"policy={module}:loop"}) is loop


async def test_a_loop_class_is_instantiated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    module = _module(tmp_path, OBJECT_LOOP)
    loop = resolve("policy", {ENV_VAR: f"policy={module}:Policy"})
    assert await loop.step(_ctx(), 2) == -2.0


async def test_a_loop_from_an_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real installed distribution as the packaging tools lay it out (dist-info on sys.path).
    module = _module(tmp_path, FUNCTION_LOOP)
    dist = tmp_path / "acme_loops-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-loops\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nacme = {module}:train\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert registered({})["acme"] == f"{module}:train"
    loop = resolve("acme", {})
    assert await loop.step(_ctx(), 1) == 5.0
    # The worker's own configuration wins over what a package declares.
    other = tmp_path / "other.py"
    other.write_text("async def train(ctx, step):\n    return 42.0\n")
    assert await resolve("acme", {ENV_VAR: f"acme={other}:train"}).step(_ctx(), 1) == 42.0


def test_the_built_in_loop_needs_no_registration() -> None:
    assert isinstance(resolve("supervised", {}), Supervised)


@pytest.mark.parametrize(
    ("source", "attr", "expected"),
    [
        ("import no_such_package_here\n", "loop", "ModuleNotFoundError"),
        ("raise RuntimeError('boom at import')\n", "loop", "boom at import"),
        ("def broken(:\n", "loop", "SyntaxError"),
        ("loop = 1\n", "missing", "has no attribute 'missing'"),
        ("loop = 1\n", "loop", "neither an object"),
        ("def loop(ctx, step):\n    return 0.0\n", "loop", "neither an object"),  # not async
    ],
)
def test_a_loop_that_fails_to_load_is_a_load_error(
    tmp_path: Path, source: str, attr: str, expected: str
) -> None:
    path = tmp_path / f"bad_{next(_names)}.py"
    path.write_text(source)
    with pytest.raises(LoopLoadError) as err:
        resolve("bad", {ENV_VAR: f"bad={path}:{attr}"})
    assert expected in str(err.value)


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("no_such_module_xyz:loop", "No module named 'no_such_module_xyz'"),
        ("/nowhere/at/all.py:loop", "/nowhere/at/all.py cannot be read on this worker"),
    ],
)
def test_a_missing_module_or_file_is_a_load_error(ref: str, expected: str) -> None:
    with pytest.raises(LoopLoadError) as err:
        resolve("gone", {ENV_VAR: f"gone={ref}"})
    assert expected in str(err.value)


# ---------------------------------------------------------------------- to_datum (SFT)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(write_tokenizer_dir(tmp_path_factory.mktemp("tok")))


def _unpack(datum: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    (chunk,) = datum["model_input"]["chunks"]
    inputs = datum["loss_fn_inputs"]
    assert inputs["target_tokens"]["shape"] == inputs["weights"]["shape"] == [len(chunk["tokens"])]
    return chunk["tokens"], inputs["target_tokens"]["data"], inputs["weights"]["data"]


def test_to_datum_weights_only_the_completion_and_its_end(tokenizer: Any) -> None:
    tokens, targets, weights = _unpack(to_datum(tokenizer, datasets.Example("Q: ", "hi"), 64))
    assert tokens == list(b"Q: hi")
    assert targets == [*b": hi", EOS]  # the inputs shifted by one, ending with EOS
    # Targets ':' and ' ' are prompt tokens: no weight; 'h', 'i' and EOS are learnt.
    assert weights == [0.0, 0.0, 1.0, 1.0, 1.0]


def test_to_datum_of_plain_text_weights_every_prediction(tokenizer: Any) -> None:
    tokens, targets, weights = _unpack(to_datum(tokenizer, datasets.Example("", "abc"), 64))
    assert tokens == list(b"abc") and targets == [*b"bc", EOS]
    assert weights == [1.0, 1.0, 1.0]


def test_to_datum_truncates_to_the_context_and_drops_prompt_only_records(tokenizer: Any) -> None:
    tokens, targets, weights = _unpack(
        to_datum(tokenizer, datasets.Example("ab", "cdefgh"), max_len=4)
    )
    assert tokens == list(b"abcd") and targets == list(b"bcde")
    assert weights == [0.0, 1.0, 1.0, 1.0]
    # A prompt that fills the whole context leaves nothing to learn: no datum.
    assert to_datum(tokenizer, datasets.Example("abcdefgh", "xyz"), max_len=4) is None


def test_to_datum_of_a_chat_record_learns_the_assistant_turn_only(tokenizer: Any) -> None:
    example = datasets.record_example(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        1,
    )
    tokens, targets, weights = _unpack(to_datum(tokenizer, example, 256))
    learnt = bytes(t for t, w in zip(targets, weights, strict=True) if w and t != EOS)
    assert learnt == b"yo\n"
    assert targets[-1] == EOS and weights[-1] == 1.0
    assert bytes(tokens).startswith(b"user: hi\nassistant: ")


async def test_a_step_takes_batch_size_records_split_over_the_micro_batches() -> None:
    class Recorder:
        tokenizer_name = "unused"

        def __init__(self) -> None:
            self.sizes: list[int] = []

        def forward_backward(self, batch: list[Any], loss_fn: str) -> Any:
            self.sizes.append(len(batch))
            return _done({"metrics": {"loss:sum": 1.0}})

        def optim_step(self, params: Any) -> Any:
            return _done(None)

    recorder = Recorder()
    ctx = _ctx()
    ctx.training_client, ctx.batch_size, ctx.micro_batches = recorder, 8, 3
    datum = {"loss_fn_inputs": {"weights": {"data": [1.0], "dtype": "float32", "shape": [1]}}}
    ctx.cache["datums"] = ([datum] * 10, [])
    await Supervised().step(ctx, 1)
    assert recorder.sizes == [3, 3, 2]  # 8 records, as batch_size says


def _done(value: Any) -> Any:
    """An already-answered future, as the client's APIFuture awaits."""
    future: asyncio.Future[Any] = asyncio.get_event_loop().create_future()
    future.set_result(SimpleNamespace(metrics=value["metrics"]) if value else value)
    return future
