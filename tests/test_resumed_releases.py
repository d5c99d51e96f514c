"""Issue 64, point 4: a resumed run never publishes a round twice without counting it.

With noise that a recomputation does not repeat (OpenDP's sampler, ``privacy.secure_noise``),
the rounds a killed process had shown its observers but not yet checkpointed are computed again
with fresh noise: a second release each. The run counts the rounds it shows before it shows them
(``<checkpoint>.released``), and a resume charges the accountant for every one the checkpoint
does not hold, so ε covers every release that was ever written."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fairclip
from fairclip.server.checkpoint import released_path
from fairclip.strategies.accounting import epsilon
from fairclip.strategies.base import DPEvent

ROUNDS = 5
SECURE = {
    "training.rounds": ROUNDS,
    "seed": 1,
    "policy.name": "bounded",
    "privacy.noise_multiplier": 1.0,
    "privacy.secure_noise": True,
}


def _killed_after(round_number: int, checkpoint: Path, seen: Path, overrides: dict, every: float) -> None:
    """A process that runs ``demo`` with ``overrides``, shows each round to an observer that
    appends it to ``seen``, and is killed (SIGKILL) right after it has shown ``round_number``."""
    script = textwrap.dedent(
        f"""
        import os, signal
        import fairclip

        class Shown:
            def on_round(self, row, run):
                with open({str(seen)!r}, "a") as handle:
                    handle.write(f"{{row['round']}}\\n")
                    handle.flush()
                    os.fsync(handle.fileno())
                if row["round"] == {round_number}:
                    os.kill(os.getpid(), signal.SIGKILL)

            def on_finish(self, run):
                pass

        fairclip.simulate("demo", overrides={overrides!r}, observers=[Shown()],
                          checkpoint={str(checkpoint)!r}, checkpoint_every={every!r})
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]


def _epsilon_of(rounds: int, summary: dict) -> float:
    privacy = summary["privacy"]
    sigma = DPEvent(privacy["noise_multiplier"], privacy["count_noise_multiplier"]).effective_noise_multiplier
    return epsilon(sigma, privacy["sample_rate"], rounds, privacy["delta"], privacy["accountant"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("killed_after", "every", "charged"),
    [(3, 1e6, 3), (4, 1e-9, 1)],
    ids=["no-checkpoint-yet", "checkpoint-one-round-behind"],
)
def test_a_killed_secure_noise_run_counts_every_round_it_showed(tmp_path, killed_after, every, charged):
    """Killed before any checkpoint (every round shown is lost), or after a checkpoint one round
    behind what was shown (the observers see a round before the checkpoint is written)."""
    checkpoint, seen = tmp_path / "run.ckpt", tmp_path / "seen.txt"
    _killed_after(killed_after, checkpoint, seen, SECURE, every)
    shown = [int(line) for line in seen.read_text().split()]
    assert shown == list(range(1, killed_after + 1))
    assert checkpoint.exists() == (every < 1)

    resumed = fairclip.simulate("demo", overrides=SECURE, checkpoint=checkpoint)
    privacy = resumed.summary["privacy"]
    assert resumed.summary["rounds_completed"] == ROUNDS
    assert privacy["rounds_released_again"] == charged
    assert privacy["rounds"] == ROUNDS + charged
    assert resumed.summary["epsilon"] == pytest.approx(
        _epsilon_of(ROUNDS + charged, resumed.summary), rel=1e-12
    )
    assert resumed.summary["epsilon"] > _epsilon_of(ROUNDS, resumed.summary)


@pytest.mark.slow
def test_a_budget_stops_the_resumed_run_that_much_earlier(tmp_path):
    """A run calibrated to ε = 4 over 5 rounds that showed 3 rounds before it was killed has 2
    rounds of budget left, and stops there, saying so."""
    checkpoint, seen = tmp_path / "run.ckpt", tmp_path / "seen.txt"
    overrides = {**SECURE, "privacy.target_epsilon": 4.0}
    del overrides["privacy.noise_multiplier"]
    _killed_after(3, checkpoint, seen, overrides, 1e6)
    resumed = fairclip.simulate("demo", overrides=overrides, checkpoint=checkpoint)
    assert resumed.summary["rounds_completed"] == ROUNDS - 3
    assert resumed.summary["privacy"]["rounds"] == ROUNDS
    assert resumed.summary["epsilon"] <= 4.0
    assert "released twice" in resumed.summary["stopped_early"]


def test_reproducible_noise_keeps_no_release_count(tmp_path):
    """Seeded noise repeats when a round is computed again: nothing to count, nothing charged."""
    checkpoint = tmp_path / "run.ckpt"
    seeded = {**SECURE, "privacy.secure_noise": False, "training.rounds": 2}
    shown = []
    result = fairclip.simulate("demo", overrides=seeded, on_round=shown.append, checkpoint=checkpoint)
    assert len(shown) == 2 and not released_path(checkpoint).exists()
    assert "rounds_released_again" not in result.summary["privacy"]


def test_secure_noise_counts_each_round_before_it_is_shown(tmp_path):
    checkpoint = tmp_path / "run.ckpt"
    counted = []

    def shown(row):
        import json

        counted.append(json.loads(released_path(checkpoint).read_text())["rounds_released"])

    fairclip.simulate(
        "demo", overrides={**SECURE, "training.rounds": 2}, on_round=shown, checkpoint=checkpoint
    )
    assert counted == [1, 2]
