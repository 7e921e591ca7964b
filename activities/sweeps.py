"""Bayesian sweeps: Optuna's TPE sampler proposes the next trial (ask) from the finished
ones (tell). The study is rebuilt from the sweep's history on each call, so the activity
holds no state and a retry proposes the same point."""

from __future__ import annotations

import logging
from typing import Any

from temporalio import activity

from shepherd.sweep import CategoricalParam, DoubleParam, IntParam, SuggestInput


def _distribution(param: Any) -> Any:
    import optuna

    if isinstance(param, DoubleParam):
        return optuna.distributions.FloatDistribution(
            param.min, param.max, log=param.scale == "log"
        )
    if isinstance(param, IntParam):
        return optuna.distributions.IntDistribution(param.min, param.max, step=param.step)
    assert isinstance(param, CategoricalParam)
    return optuna.distributions.CategoricalDistribution(param.values)


class SweepActivities:
    @activity.defn(name="suggest_trial")
    async def suggest_trial(self, inp: SuggestInput) -> dict[str, Any]:
        import optuna

        optuna.logging.set_verbosity(logging.WARNING)
        distributions = {name: _distribution(p) for name, p in sorted(inp.parameters.items())}
        study = optuna.create_study(
            direction="minimize" if inp.minimize else "maximize",
            sampler=optuna.samplers.TPESampler(seed=inp.seed + inp.index, n_startup_trials=3),
        )
        for params, value in inp.history:
            study.add_trial(
                optuna.trial.create_trial(params=params, distributions=distributions, value=value)
            )
        return dict(study.ask(distributions).params)
