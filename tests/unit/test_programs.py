"""Program jobs, what needs no running system: the spec's rules for ``training.program`` and
``training.args``, and the workers' program registry (the command it builds: each argument
one argv item, never a shell line; keys the registration fixes cannot be set)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from shepherd import programs
from shepherd.spec import SpecError, submission_problems, validate_spec


def _spec(**training: Any) -> Any:
    return validate_spec(
        {
            "name": "prog",
            "trainer": {"base_model": "accounts/fireworks/models/qwen3-8b"},
            "training": training,
            "checkpoint": {"every_steps": 5},
            "output": {"model_id": "prog-model"},
        }
    )


def test_a_program_job_needs_no_total_and_measures_train_loss() -> None:
    spec = _spec(program="cookbook-chat-sl", args={"max_steps": 10, "dataset": "a.jsonl"})
    assert spec.training.total_steps is None and spec.total_steps == 0
    assert spec.checkpoint.metric == "train_loss" and submission_problems(spec) == []
    # Dumped and read again (as the CLI and the workflow do), it is the same job.
    again = validate_spec(spec.model_dump(mode="json"))
    assert again.training == spec.training


@pytest.mark.parametrize(
    ("training", "field", "rule"),
    [
        ({"program": "p", "loop": "mine"}, "training.loop", "mutually exclusive"),
        ({"program": "p", "dataset": "file:///x.jsonl"}, "training.dataset", "own"),
        ({"program": "p", "batch_size": 8}, "training.batch_size", "own"),
        ({"program": "Bad Name"}, "training.program", "registered"),
        ({"program": "p", "args": {"a b": 1}}, "training.args", "dotted path"),
        ({"program": "p", "args": {"x": float("nan")}}, "training.args.x", "finite"),
        ({"program": "p", "args": {"x": [1, 2]}}, "training.args.x", "scalar"),
        ({"program": "p", "args": {"x": "v" * 1001}}, "training.args", "1000 characters"),
        ({"program": "p", "args": {"x": "a\nb"}}, "training.args", "control"),
        ({"args": {"x": 1}, "total_steps": 5}, "training.args", "set training.program"),
        ({"dataset": "synthetic:text"}, "training.total_steps", "required for a loop"),
        (
            {
                "program": "p",
                "resume_from": "accounts/a/rlorTrainerJobs/j/checkpoints/step-00000004",
            },
            "training.resume_from",
            "resumes from its own checkpoints",
        ),
    ],
)
def test_bad_program_settings_name_the_field(
    training: dict[str, Any], field: str, rule: str
) -> None:
    with pytest.raises(SpecError) as refused:
        _spec(**training)
    text = str(refused.value)
    assert field in text and rule in text, text


def _metric_spec(**sections: Any) -> Any:
    data: dict[str, Any] = {
        "name": "prog",
        "trainer": {"base_model": "accounts/fireworks/models/qwen3-8b"},
        "training": {"program": "p"},
        "checkpoint": {"every_steps": 5},
        "output": {"model_id": "prog-model"},
    }
    for key, value in sections.items():
        data[key] = {**data[key], **value}
    return validate_spec(data)


def test_a_program_tracks_the_wire_or_its_own_metrics() -> None:
    # By default the step's training loss from the wire; any metric the program writes.
    assert _metric_spec().checkpoint.metric == "train_loss"
    spec = _metric_spec(
        checkpoint={"metric": "env/all/reward/total", "mode": "max"},
        training={"metrics": ["test/nll", "test/nll", "optim/lr"]},
    )
    assert spec.checkpoint.metric == "env/all/reward/total" and spec.checkpoint.mode == "max"
    assert spec.training.metrics == ["test/nll", "optim/lr"]  # once each


@pytest.mark.parametrize(
    ("sections", "field", "rule"),
    [
        ({"checkpoint": {"metric": "reward total"}}, "checkpoint.metric", "1-64 characters"),
        ({"training": {"metrics": ["ok", "not ok"]}}, "training.metrics", "'not ok'"),
        ({"training": {"metrics": [f"m{i}" for i in range(9)]}}, "training.metrics", "8"),
        (
            {"training": {"program": None, "total_steps": 10, "metrics": ["x"]}},
            "training.metrics",
            "are a program's metrics",
        ),
    ],
)
def test_bad_metric_settings_name_the_field(
    sections: dict[str, Any], field: str, rule: str
) -> None:
    with pytest.raises(SpecError) as refused:
        _metric_spec(**sections)
    text = str(refused.value)
    assert field in text and rule in text, text


def test_the_command_is_argv_items_with_the_log_dir_last() -> None:
    program = programs.Program(
        name="mine",
        module="pkg.train",
        args=("behavior_if_log_dir_exists=resume",),
        log_dir_arg="log_path",
        total_steps_arg="max_steps",
    )
    argv = program.command(
        "/py", {"max_steps": 7, "note": "a b; rm -rf /", "flag": True}, Path("/logs/j")
    )
    assert argv == [
        "/py",
        "-m",
        "pkg.train",
        "behavior_if_log_dir_exists=resume",
        "max_steps=7",
        "note=a b; rm -rf /",  # one argv item: no shell ever reads it
        "flag=True",
        "log_path=/logs/j",
    ]
    assert program.total_steps({"max_steps": 7}) == 7 and program.total_steps({}) is None
    for fixed in ("log_path", "behavior_if_log_dir_exists"):
        with pytest.raises(programs.ProgramError, match="registration"):
            program.command("/py", {fixed: "x"}, Path("/l"))


def test_programs_come_from_the_environment_and_the_cookbook() -> None:
    env = {
        programs.ENV_VAR: json.dumps(
            {"my-sft": {"script": "/opt/train.py", "log_dir_arg": "log_dir", "env": {"A": "1"}}}
        )
    }
    found = programs.registered(env)
    assert {"cookbook-chat-sl", "cookbook-math-rl", "my-sft"} <= set(found)
    assert found["my-sft"].command("/py", {}, Path("/l")) == ["/py", "/opt/train.py", "log_dir=/l"]
    with pytest.raises(programs.ProgramError, match="no program 'nope'.*SHEPHERD_PROGRAMS"):
        programs.resolve("nope", env)


@pytest.mark.parametrize(
    ("registration", "rule"),
    [
        ("[1]", "JSON object"),
        ("{", "not a JSON object"),
        ('{"x": {"module": "a", "script": "/b"}}', "exactly one of module and script"),
        ('{"x": {"script": "rel/path.py"}}', "absolute path"),
        ('{"x": {"module": "a", "shell": "rm"}}', "unknown fields shell"),
        ('{"x": {"module": "a", "args": "k=v"}}', "list of strings"),
    ],
)
def test_bad_registrations_say_what_is_wrong(registration: str, rule: str) -> None:
    with pytest.raises(programs.ProgramError, match=rule):
        programs.registered({programs.ENV_VAR: registration})


def test_the_log_dir_is_the_jobs_own_under_the_program_dir(tmp_path: Path) -> None:
    env = {programs.DIR_ENV_VAR: str(tmp_path)}
    assert programs.log_dir("job-1", env) == tmp_path / "job-1"


def test_a_retry_starts_in_a_copy_of_the_failed_jobs_log_directory(tmp_path: Path) -> None:
    """The program's own checkpoints and the proxy's id map come along; the old program's
    output does not; a directory that exists (a later attempt) is left alone."""
    old, new = tmp_path / "job-a", tmp_path / "job-b"
    (old / "sub").mkdir(parents=True)
    (old / "checkpoints.jsonl").write_text('{"step": 4}\n')
    (old / "sub" / "x").write_text("x")
    (old / programs.OUTPUT_FILE).write_text("old output\n")
    assert programs.seed_log_dir(new, old)
    assert (new / "checkpoints.jsonl").read_text() == '{"step": 4}\n'
    assert (new / "sub" / "x").exists() and not (new / programs.OUTPUT_FILE).exists()
    assert not (tmp_path / "job-b.seeding").exists()
    (new / "checkpoints.jsonl").write_text("mine\n")
    assert not programs.seed_log_dir(new, old)  # already there: kept as it is
    assert (new / "checkpoints.jsonl").read_text() == "mine\n"
    assert not programs.seed_log_dir(tmp_path / "job-c", tmp_path / "nothing")
    assert not (tmp_path / "job-c").exists()


def test_a_sweep_varies_a_programs_arguments() -> None:
    """A sweep's axes may be ``training.args.*``: each trial passes its own value to the
    program (as one more ``key=value``); a value the rules refuse names its axis."""
    from shepherd.sweep import grid_points, trial_spec, validate_sweep

    base = _spec(program="cookbook-chat-sl", args={"max_steps": 10}).model_dump(mode="json")
    sweep = validate_sweep(
        {
            "name": "prog-sweep",
            "spec": base,
            "method": "grid",
            "parameters": {
                "training.args.learning_rate": {
                    "type": "double",
                    "min": 1e-5,
                    "max": 1e-3,
                    "scale": "log",
                    "grid_points": 3,
                },
                "training.args.batch_size": {"type": "categorical", "values": [4, 8]},
            },
        }
    )
    trials = [trial_spec(sweep, i, p) for i, p in enumerate(grid_points(sweep))]
    assert len(trials) == 6
    assert {(t.training.args["batch_size"], t.training.args["max_steps"]) for t in trials} == {
        (4, 10),
        (8, 10),
    }
    assert len({t.training.args["learning_rate"] for t in trials}) == 3
    with pytest.raises(SpecError) as refused:
        validate_sweep(
            {
                "name": "prog-sweep",
                "spec": base,
                "parameters": {"training.args.x": {"type": "categorical", "values": ["a\nb"]}},
            }
        )
    assert "training.args" in str(refused.value)


# ------------------------------------------- what the registration fixes, refused at submission

SCRIPT_REGISTRATION = {
    "tinker-sft": {"script": "/opt/sft.py", "log_dir_arg": "log_dir", "args": ["seed=3"]}
}


@pytest.mark.parametrize(
    ("program", "key", "passed"),
    [
        ("tinker-sft", "log_dir", "the job's log directory"),
        ("tinker-sft", "seed", "seed=3"),
        ("cookbook-chat-sl", "log_path", "the job's log directory"),
        ("cookbook-chat-sl", "behavior_if_log_dir_exists", "behavior_if_log_dir_exists=resume"),
    ],
)
def test_an_argument_the_registration_fixes_is_refused_at_submission(
    monkeypatch: pytest.MonkeyPatch, program: str, key: str, passed: str
) -> None:
    """Where the submitting process knows the program (the registry the workers read), a key
    its registration fixes is a SpecError naming ``training.args.<key>`` and the rule, as
    ``shepherd validate`` and ``submit`` show it, not a worker's failure later."""
    monkeypatch.setenv(programs.ENV_VAR, json.dumps(SCRIPT_REGISTRATION))
    with pytest.raises(SpecError) as refused:
        _spec(program=program, args={key: "x", "max_steps": 4})
    [problem] = refused.value.problems
    assert problem.field == f"training.args.{key}"
    assert problem.rule == (
        f"is fixed by the registration of program {program!r} (Shepherd passes {passed}); "
        "leave it out"
    )
    # A program this process does not know is the workers' to judge.
    assert _spec(program="elsewhere", args={key: "x"}).training.args == {key: "x"}


def test_shepherd_validate_names_the_fixed_argument(tmp_path: Path) -> None:
    import subprocess
    import sys

    import yaml

    spec = tmp_path / "job.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "prog",
                "trainer": {"base_model": "accounts/fireworks/models/qwen3-8b"},
                "training": {"program": "tinker-sft", "args": {"log_dir": "/tmp/mine"}},
                "output": {"model_id": "prog-model"},
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "shepherd.cli.main", "validate", str(spec)],
        capture_output=True,
        text=True,
        env={**os.environ, programs.ENV_VAR: json.dumps(SCRIPT_REGISTRATION)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "training.args.log_dir: is fixed by the registration of program 'tinker-sft'" in (
        done.stderr
    )


def test_the_workers_check_words_it_as_the_submission_does() -> None:
    program = programs.Program(name="tinker-sft", script="/opt/sft.py", log_dir_arg="log_dir")
    with pytest.raises(programs.ProgramError) as refused:
        program.check_args({"log_dir": "x", "bad key": 1})
    assert str(refused.value) == (
        "training.args.log_dir: is fixed by the registration of program 'tinker-sft' (Shepherd "
        "passes the job's log directory); leave it out; training.args: 'bad key' is not a "
        "key=value key"
    )


# ---------------------------------------------------- cookbook recipes registered by hand


def _by_hand(module: str, **fields: Any) -> programs.Program:
    env = {programs.ENV_VAR: json.dumps({"mine": {"module": module, **fields}})}
    return programs.registered(env)["mine"]


@pytest.mark.parametrize(
    "module", ["tinker_cookbook.recipes.chat_sl.train", "tinker_cookbook.recipes.math_rl.train"]
)
def test_a_cookbook_recipe_registered_by_hand_resumes_instead_of_asking(module: str) -> None:
    """The recipe's ``behavior_if_log_dir_exists`` defaults to "ask", which reads stdin when
    the log directory exists; a job's always does (Shepherd makes it), so the hand-made
    registration died at once with EOFError. It resumes, as the built-in ones do."""
    program = _by_hand(module, log_dir_arg="log_path")
    argv = program.command("/py", {"max_steps": 3}, Path("/logs/j"))
    assert argv == [
        "/py",
        "-m",
        module,
        "behavior_if_log_dir_exists=resume",
        "max_steps=3",
        "log_path=/logs/j",
    ]
    assert program.problem() is None and "behavior_if_log_dir_exists" in program.fixed_keys
    # The command the built-in registration of the same recipe runs (tests/workflows/
    # test_examples_run.py runs that one to its end).
    builtin = {p.module: p for p in programs.registered({}).values()}[module]
    assert builtin.command("/py", {"max_steps": 3}, Path("/logs/j")) == argv
    # The registration's own choice stands; modules outside the cookbook are not touched.
    chosen = _by_hand(module, args=["behavior_if_log_dir_exists=raise"])
    assert chosen.args == ("behavior_if_log_dir_exists=raise",)
    assert _by_hand("pkg.train").args == ()


@pytest.mark.parametrize(
    "module", ["tinker_cookbook.recipes.sl_basic", "tinker_cookbook.recipes.rl_basic"]
)
def test_a_cookbook_recipe_that_always_asks_is_refused_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    """sl_basic and rl_basic ask on stdin whatever their arguments say: no job can run them,
    and a submission says so, naming what to register instead."""
    registration = {"basic": {"module": module, "log_dir_arg": "log_path"}}
    monkeypatch.setenv(programs.ENV_VAR, json.dumps(registration))
    with pytest.raises(SpecError) as refused:
        _spec(program="basic")
    [problem] = refused.value.problems
    assert problem.field == "training.program"
    assert "asks on its stdin" in problem.rule and "chat_sl.train" in problem.rule


def test_a_total_in_batches_is_counted_in_optimizer_steps() -> None:
    """math_rl's max_steps counts batches, each num_substeps optimizer steps: the job's total
    is their product (the registration says which argument is which)."""
    rl = programs.Program(
        name="rl",
        module="pkg.rl",
        total_steps_arg="max_steps",
        substeps_arg="num_substeps",
        args=("num_substeps=3",),
    )
    assert rl.total_steps({"max_steps": 5}) == 15  # the registration's substeps
    assert rl.total_steps({"max_steps": 5, "num_substeps": 2}) == 10  # the job's own
    assert rl.total_steps({}) is None
    plain = programs.Program(name="sl", module="pkg.sl", total_steps_arg="max_steps")
    assert plain.total_steps({"max_steps": "7"}) == 7
    mapped = programs.Program.from_mapping(
        "byhand", {"module": "pkg.rl", "total_steps_arg": "max_steps", "substeps_arg": "k"}
    )
    assert mapped.total_steps({"max_steps": 4, "k": 2}) == 8
