"""A program that makes no model and exits 0 (``python -m tests.workflows.idle_program``): a
job that asks to promote its last checkpoint must fail, saying why, not hang."""

if __name__ == "__main__":
    print("nothing to train", flush=True)  # noqa: T201
