"""The build plan (aoti's and inductor's): how many steps at once (the CPUs a cgroup quota
leaves: host.py; whether this process's Inductor config can reach a worker). No worker
starts, nothing compiles."""

from __future__ import annotations

import os

import pytest
from _cgroup_util import cgroup_tree
from torch._inductor import config as inductor_config
from typer.testing import CliRunner

from artifactcache import host
from artifactcache.backends.shared.build_plan import (
    JOBS_ENV,
    build_jobs,
    inductor_config_left_behind,
    planned_jobs,
)
from artifactcache.choices import BuildChoices
from artifactcache.cli.app import app
from artifactcache.errors import BackendError
from artifactcache.recipes import load_recipe


def test_a_container_with_a_small_quota_builds_serially_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv(JOBS_ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    monkeypatch.setattr(host, "CGROUP_ROOT", cgroup_tree(tmp_path, {"cpu.max": "200000 100000"}))
    assert host.usable_cores() == 2
    assert build_jobs("cpu", 2) == 1  # 64 in its affinity, 2 CPUs of quota
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert build_jobs("cpu", 2) == 2


def post_grad_pass(graph) -> None:
    """A custom pass: a callable, which the portable config cannot carry."""


def test_a_config_a_worker_cannot_take_keeps_the_build_in_this_process(monkeypatch):
    recipe, opts = load_recipe("tiny-llama"), BuildChoices(device="cuda")  # concurrent
    monkeypatch.delenv(JOBS_ENV, raising=False)
    monkeypatch.setattr("artifactcache.sizing.available_memory", lambda device: None)
    assert planned_jobs(recipe, opts, 2) == 2
    with inductor_config.patch(max_autotune=True):  # the portable config carries it
        assert inductor_config_left_behind() == []
        assert planned_jobs(recipe, opts, 2) == 2
    for change in ({"post_grad_custom_post_pass": post_grad_pass}, {"_micro_pipeline_tp": True}):
        (name,) = change
        with inductor_config.patch(change):
            assert inductor_config_left_behind() == [name]
            monkeypatch.delenv(JOBS_ENV, raising=False)
            assert planned_jobs(recipe, opts, 2) == 1  # the default: serial
            monkeypatch.setenv(JOBS_ENV, "2")
            with pytest.raises(BackendError) as e:  # asked for: refused, not built otherwise
                planned_jobs(recipe, opts, 2)
            assert name in str(e.value) and f"{JOBS_ENV}=1" in str(e.value)
            assert "\n" not in str(e.value)
            monkeypatch.setenv(JOBS_ENV, "1")
            assert planned_jobs(recipe, opts, 2) == 1
    assert inductor_config_left_behind() == []  # a patch undone leaves nothing behind


def test_asking_for_workers_with_a_custom_pass_is_a_one_line_cli_error(cache_dir, monkeypatch):
    monkeypatch.setenv(JOBS_ENV, "2")
    with inductor_config.patch(post_grad_custom_post_pass=post_grad_pass):
        result = CliRunner().invoke(
            app, ["build", "tiny-llama", "-b", "aoti", "--cache-dir", str(cache_dir)]
        )
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "post_grad_custom_post_pass" in lines[0] and f"{JOBS_ENV}=1" in lines[0]
    assert not list((cache_dir / "v1" / "entries").rglob("manifest.json"))
