"""Crash-safe resume: SIGKILL after a checkpoint, resume, and end where an uninterrupted run ends."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from hf_seqrl.trainers.services.checkpoints import STATE_FILE, last_complete_checkpoint

WORKER = os.path.join(os.path.dirname(__file__), "resume_worker.py")


def worker(out, kill_at=-1, resume=False, num_iterations=1, trainer="reinforce", model="seq2seq", lora=False):
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", RESUME_WORKER_MODEL=model,
               RESUME_WORKER_LORA="1" if lora else "0")
    return subprocess.run([sys.executable, WORKER, str(out), str(kill_at), "1" if resume else "0", str(num_iterations),
                           trainer], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    proc = worker(out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(out / "history.json") as f:
        return torch.load(out / "final.pt"), json.load(f)


# warm-up is steps 0-9, checkpoints every 5 steps: a kill during warm-up, one right after the warm-up -> RL
# boundary (checkpoint 10 is the last warm-up state), and one during RL.
@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [7, 11, 17])
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path, uninterrupted, kill_at):
    full_params, full_history = uninterrupted
    killed = worker(tmp_path, kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "final.pt").exists()
    resumed = worker(tmp_path, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    params = torch.load(tmp_path / "final.pt")
    for key in full_params:
        # Same kernels, same data order, restored RNG: bitwise equal on CPU.
        assert torch.equal(params[key], full_params[key]), key
    with open(tmp_path / "history.json") as f:
        history = json.load(f)
    assert history["rewards"] == full_history["rewards"]
    assert history["baseline_ema"] == full_history["baseline_ema"]


@pytest.mark.slow
def test_sigkill_inside_a_reuse_cycle_then_resume_matches_uninterrupted_run(tmp_path):
    """Rollouts serve 2 clipped steps with 2 accumulation steps; the kill at step 5 resumes from checkpoint-3,
    taken between the two steps of the cycle 2-3, whose second step needs the rollouts saved with it."""
    full = worker(tmp_path / "full", num_iterations=2)
    assert full.returncode == 0, full.stderr[-2000:]
    killed = worker(tmp_path / "cut", kill_at=5, num_iterations=2)
    assert killed.returncode == -signal.SIGKILL
    assert (tmp_path / "cut" / "checkpoint-3" / "rollout_buffer_rank0.pt").exists()
    resumed = worker(tmp_path / "cut", resume=True, num_iterations=2)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    full_params, params = torch.load(tmp_path / "full" / "final.pt"), torch.load(tmp_path / "cut" / "final.pt")
    for key in full_params:
        assert torch.equal(params[key], full_params[key]), key
    histories = [json.loads((tmp_path / run / "history.json").read_text()) for run in ("full", "cut")]
    assert histories[0] == histories[1]


@pytest.mark.slow
@pytest.mark.parametrize("trainer,model", [("mixer", "seq2seq"), ("pf", "seq2seq"), ("noise_level", "seq2seq"),
                                           ("kstep", "seq2seq"), ("mrt", "causal"), ("noise_level", "causal"),
                                           ("mixer", "causal"), ("distill", "seq2seq"), ("distill", "causal")])
def test_sigkill_then_resume_other_trainers(tmp_path, trainer, model):
    """MIXER (Δ schedule, moving-average baseline), professor forcing (its discriminator and optimizer), noise-level
    forcing and k-step rollout (RNG draws every step), MRT, and distillation (on-policy steps drawn by step), killed after checkpoint-3 resume from it and end
    where an uninterrupted run ends; on a tiny T5 or a tiny decoder-only Llama."""
    full = worker(tmp_path / "full", trainer=trainer, model=model)
    assert full.returncode == 0, full.stderr[-2000:]
    killed = worker(tmp_path / "cut", kill_at=5, trainer=trainer, model=model)
    assert killed.returncode == -signal.SIGKILL
    resumed = worker(tmp_path / "cut", resume=True, trainer=trainer, model=model)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    full_params, params = torch.load(tmp_path / "full" / "final.pt"), torch.load(tmp_path / "cut" / "final.pt")
    for key in full_params:
        assert torch.equal(params[key], full_params[key]), key
    histories = [json.loads((tmp_path / run / "history.json").read_text()) for run in ("full", "cut")]
    assert histories[0]["losses"] == histories[1]["losses"]


def test_partial_checkpoint_is_not_picked(tmp_path):
    for step in (5, 10):
        os.makedirs(tmp_path / f"checkpoint-{step}")
    (tmp_path / "checkpoint-5" / STATE_FILE).write_text("{}")
    # checkpoint-10 was being written when the process died: no state file yet
    assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-5")
    shutil.rmtree(tmp_path / "checkpoint-5")
    assert last_complete_checkpoint(str(tmp_path)) is None
    assert last_complete_checkpoint(str(tmp_path / "missing")) is None


@pytest.mark.slow
def test_resume_true_skips_a_partial_checkpoint(tmp_path):
    """A real run, then a half-written newer checkpoint: resume picks the complete one."""
    proc = worker(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    newest = tmp_path / "checkpoint-25"
    shutil.copytree(tmp_path / "checkpoint-20", newest)
    (newest / STATE_FILE).unlink()
    (newest / "model.safetensors").write_bytes(b"truncated")
    assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-20")
    resumed = worker(tmp_path, resume=True)  # would crash on the truncated weights if it picked checkpoint-25
    assert resumed.returncode == 0, resumed.stderr[-2000:]


@pytest.mark.slow
def test_causal_model_sigkill_during_rl_then_resume_matches_uninterrupted_run(tmp_path):
    full, interrupted = tmp_path / "full", tmp_path / "interrupted"
    proc = worker(full, model="causal")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert worker(interrupted, kill_at=17, model="causal").returncode == -signal.SIGKILL
    resumed = worker(interrupted, resume=True, model="causal")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    full_params, params = torch.load(full / "final.pt"), torch.load(interrupted / "final.pt")
    for key in full_params:
        assert torch.equal(params[key], full_params[key]), key
    histories = [json.loads((folder / "history.json").read_text()) for folder in (full, interrupted)]
    assert histories[0]["rewards"] == histories[1]["rewards"] and len(histories[0]["rewards"]) == 10


@pytest.mark.slow
def test_sigkill_then_resume_with_a_lora_adapter_matches_uninterrupted_run(tmp_path):
    """A LoRA adapter (KL reference: the adapter off) killed during RL resumes from its adapter checkpoint and ends
    with the adapter and rewards of an uninterrupted run."""
    pytest.importorskip("peft")
    full = worker(tmp_path / "full", lora=True)
    assert full.returncode == 0, full.stderr[-2000:]
    killed = worker(tmp_path / "cut", kill_at=17, lora=True)
    assert killed.returncode == -signal.SIGKILL
    assert (tmp_path / "cut" / "checkpoint-15" / "adapter_model.safetensors").exists()
    resumed = worker(tmp_path / "cut", resume=True, lora=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    full_params, params = torch.load(tmp_path / "full" / "final.pt"), torch.load(tmp_path / "cut" / "final.pt")
    assert any("lora_B" in key for key in full_params)
    for key in full_params:
        assert torch.equal(params[key], full_params[key]), key
    histories = [json.loads((tmp_path / run / "history.json").read_text()) for run in ("full", "cut")]
    assert histories[0] == histories[1]

