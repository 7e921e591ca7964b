"""How one trainer process is set up: the plane writes it as JSON, the trainer reads it."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from shepherd.platform import rules


@dataclass
class TrainerConfig:
    account: str
    job: str
    generation: int
    data_dir: Path
    base_model: str
    lora_rank: int = 0
    #: Adam's learning rate when a client's adam_params leave it out.
    learning_rate: float = 1e-4
    max_context_length: int = 8192
    #: Seeds LoRA adapters (a create_model's lora_config.seed wins).
    seed: int = 0
    #: Emulated GPU time per forward/forward_backward call.
    compute_delay_s: float = 0.0
    inactivity_timeout_s: float = 3600.0
    forward_only: bool = False
    keys_file: Path | None = None
    #: How long retrieve_future holds a request open before answering try_again. Clients
    #: time out at 45 s, so 20 s leaves room for a slow network.
    retrieve_hold_s: float = 20.0
    #: How long a later seq_id waits for a missing earlier one before the model breaks; tied
    #: to the longest route-race window a job spec may ask for (rules.SEQ_GAP_HOLD_S).
    seq_gap_timeout_s: float = rules.SEQ_GAP_HOLD_S
    #: Whether the trainer also speaks the protobuf dialect (tinker 0.38). Off, it speaks JSON
    #: only, as hosted Fireworks trainers do: a protobuf request is a 415, results are JSON.
    protobuf: bool = True

    @property
    def job_name(self) -> str:
        return f"accounts/{self.account}/rlorTrainerJobs/{self.job}"

    @classmethod
    def from_json(cls, text: str) -> TrainerConfig:
        raw = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        raw = {k: v for k, v in raw.items() if k in known}
        raw["data_dir"] = Path(raw["data_dir"])
        if raw.get("keys_file"):
            raw["keys_file"] = Path(raw["keys_file"])
        return cls(**raw)

    def to_json(self) -> str:
        raw = dataclasses.asdict(self)
        raw["data_dir"] = str(self.data_dir)
        raw["keys_file"] = str(self.keys_file) if self.keys_file else None
        return json.dumps(raw)
