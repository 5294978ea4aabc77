"""The ``policystore`` command end to end: offline on real folders, online against a real local Ray cluster that
the CLI joins by address from a subprocess (and in-process through ``main(argv)``)."""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from policystore.cli import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, main
from policystore.durable import DurableTier
from policystore.format import pack, parse_header
from policystore.ids import SnapshotId

ROOT = Path(__file__).resolve().parents[2]


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"fc.weight": torch.randn(16, 8, generator=g), "fc.bias": torch.randn(16, generator=g)}


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """main(argv) in this process: (exit code, stdout)."""
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().out


def run_cli_subprocess(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "policystore", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


# ---- offline: a durable tier folder ------------------------------------------------------------------------------
@pytest.fixture
def durable_dir(tmp_path):
    tier = DurableTier.open(str(tmp_path / "durable"))
    for sid, meta in [(SnapshotId("main_0", 1), {"step": 1}), (SnapshotId("main_0", 2), {"frozen": True}),
                      (SnapshotId("main_0", 3), {"step": 3}), (SnapshotId("expl", 1), {})]:
        buf = pack(_weights(sid.version), policy_id=sid.policy_id, meta=meta)
        tier.write(sid, buf, parse_header(buf, name=str(sid)))
    return tmp_path / "durable"


def test_offline_ls_verify_export_du_stats(capsys, durable_dir, tmp_path):
    code, out = run_cli(capsys, "--dir", str(durable_dir), "ls", "--json")
    assert code == EXIT_OK
    rows = json.loads(out)
    assert [(r["policy_id"], r["version"]) for r in rows] == [("expl", 1), ("main_0", 1), ("main_0", 2), ("main_0", 3)]
    assert rows[2]["meta"] == {"frozen": True} and rows[2]["checksum"].startswith("crc32")

    code, out = run_cli(capsys, "ls", "main_0", "--dir", str(durable_dir))  # a table, options after the command
    assert code == EXIT_OK and "main_0" in out and "frozen" in out and "expl" not in out

    code, out = run_cli(capsys, "--json", "--dir", str(durable_dir), "verify")
    assert code == EXIT_OK and all(r["ok"] for r in json.loads(out))

    target = tmp_path / "out.safetensors"
    code, _ = run_cli(capsys, "--dir", str(durable_dir), "export", "main_0", "2", "-o", str(target))
    assert code == EXIT_OK
    loaded = load_file(str(target))
    assert all(torch.equal(loaded[k], v) for k, v in _weights(2).items())
    with safe_open(str(target), framework="pt") as f:
        assert json.loads(f.metadata()["policystore.meta"]) == {"frozen": True}
    code, _ = run_cli(capsys, "--dir", str(durable_dir), "export", "main_0", "-o", str(target))
    assert code == EXIT_USAGE  # refuses to overwrite without --force

    code, out = run_cli(capsys, "--json", "--dir", str(durable_dir), "du")
    du = json.loads(out)
    assert du["total"]["versions"] == 4 and {p["policy_id"]: p["versions"] for p in du["policies"]}["main_0"] == 3

    code, out = run_cli(capsys, "--json", "--dir", str(durable_dir), "stats")
    assert code == EXIT_OK and json.loads(out)[0]["snapshots"] == 4


def test_ls_pages_with_limit_and_after(capsys, durable_dir):
    ids, after = [], []
    while True:  # not a wait: pages until ls answers an empty page
        code, out = run_cli(capsys, "--dir", str(durable_dir), "ls", "--json", "--limit", "3", *after)
        assert code == EXIT_OK
        page = [f"{r['policy_id']}@v{r['version']}" for r in json.loads(out)]
        if not page:
            break
        assert len(page) <= 3
        ids.extend(page)
        after = ["--after", page[-1]]
    assert ids == ["expl@v1", "main_0@v1", "main_0@v2", "main_0@v3"]
    code, out = run_cli(capsys, "--dir", str(durable_dir), "ls", "main_0", "--json", "--after", "main_0@1")
    assert [r["version"] for r in json.loads(out)] == [2, 3]
    for bad in (["--limit", "0"], ["--after", "main_0"], ["--after", "../x@v1"], ["--after", "main_0@v0"]):
        assert run_cli(capsys, "--dir", str(durable_dir), "ls", *bad)[0] == EXIT_USAGE, bad


def test_offline_verify_finds_damage(capsys, durable_dir):
    marker = json.loads((durable_dir / "main_0" / "0000000003.commit.json").read_text())
    data = durable_dir / "main_0" / marker["object"]
    raw = bytearray(data.read_bytes())
    raw[-3] ^= 0xFF
    data.write_bytes(bytes(raw))
    code, out = run_cli(capsys, "--json", "--dir", str(durable_dir), "verify", "main_0")
    assert code == EXIT_PROBLEM
    results = {r["version"]: r for r in json.loads(out)}
    assert not results[3]["ok"] and "checksum" in results[3]["problems"][0]
    assert results[1]["ok"] and results[2]["ok"]


def test_offline_gc_dry_run_and_refusals(capsys, durable_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    code, out = run_cli(capsys, "--json", "--dir", str(durable_dir), "gc", "--keep-last", "1", "--keep-meta", "frozen",
                        "--dry-run")
    assert code == EXIT_OK
    plan = json.loads(out)
    assert plan["delete"] == ["main_0@v1"] and plan["deleted"] == []
    assert set(plan["kept"]) == {"expl@v1", "main_0@v2", "main_0@v3"}
    for argv in (["gc", "--keep-last", "0", "--dry-run"],  # the latest version always stays
                 ["gc", "--dry-run"],  # no retention rule
                 ["rm", "main_0"], ["import", str(tmp_path), "p"],
                 ["ls", "nosuch"], ["ls", "../escape"], ["verify", "main_0", "9"]):
        code, _ = run_cli(capsys, "--dir", str(durable_dir), *argv)
        assert code == EXIT_USAGE, argv
    code, _ = run_cli(capsys, "--dir", str(tmp_path / "missing"), "ls")
    assert code == EXIT_USAGE
    # nowhere to read from: no address, and no `ray start` record in Ray's temp folder (an empty one of this test's
    # own, so a local Ray that another test starts meanwhile, which writes its record in /tmp/ray, is not joined)
    (tmp_path / "no-ray").mkdir()
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "no-ray"))
    code, _ = run_cli(capsys, "ls")
    assert code == EXIT_USAGE
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == EXIT_USAGE


def test_help_explains_every_command_with_an_example(capsys):
    result = run_cli_subprocess("--help")
    assert result.returncode == 0 and "exit codes" in result.stdout
    for command in ("ls", "stats", "verify", "export", "import", "rm", "du", "gc"):
        assert command in result.stdout
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
        text = capsys.readouterr().out
        assert "example:" in text and f"policystore {command}" in text


def test_offline_spill_folder_through_the_reader(capsys, tmp_path):
    from policystore.spill import DiskTier

    disk = DiskTier(tmp_path / "spill")
    sid = SnapshotId("p", 1)
    buf = pack(_weights(1), policy_id="p", meta={"frozen": True})
    disk.commit(disk.write_temp(sid, buf, parse_header(buf, name="p")), sid)
    code, out = run_cli(capsys, "--json", "--dir", str(tmp_path / "spill"), "ls")
    assert code == EXIT_OK and [(r["policy_id"], r["version"]) for r in json.loads(out)] == [("p", 1)]
    code, _ = run_cli(capsys, "--dir", str(tmp_path / "spill"), "verify")
    assert code == EXIT_OK


# ---- online: a real cluster -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spill_root(tmp_path_factory):
    return tmp_path_factory.mktemp("spill")


@pytest.fixture(scope="module")
def cluster(spill_root):
    """A local Ray cluster this process starts (free ports, its own session), whose GCS address the CLI joins
    from a subprocess; a store on it holds main_0 v1..v3 (v2 frozen) and expl v1."""
    import ray

    import policystore

    ray.init(address="local", num_cpus=1, object_store_memory=300_000_000, include_dashboard=False,
             logging_level="warning")
    try:
        store = policystore.connect(policystore.StoreConfig(spill_dir=str(spill_root), hot_capacity_bytes=100_000_000))
        store.publish("main_0", _weights(1), {"step": 1})
        store.publish("main_0", _weights(2), {"frozen": True})
        store.publish("main_0", _weights(3), {"step": 3})
        store.publish("expl", _weights(10), {})
        store.flush()
        yield ray.get_runtime_context().gcs_address
    finally:
        policystore.client.shutdown_all()
        ray.shutdown()


def test_subprocess_ls_and_stats_against_the_cluster(cluster):
    result = run_cli_subprocess("--json", "ls", env={"RAY_ADDRESS": cluster})
    assert result.returncode == EXIT_OK, result.stderr
    rows = json.loads(result.stdout)
    assert [(r["policy_id"], r["version"]) for r in rows] == [("expl", 1), ("main_0", 1), ("main_0", 2), ("main_0", 3)]
    assert all(list(r["tiers"].values()) == ["hot"] for r in rows)
    assert rows[2]["meta"] == {"frozen": True}
    result = run_cli_subprocess("--address", cluster, "stats")
    assert result.returncode == EXIT_OK, result.stderr
    assert "hot_bytes" in result.stdout and "publishes" in result.stdout
    assert "durable_pending" in result.stdout and "durable_failures" in result.stdout  # the durable backlog


def test_verify_export_import_round_trip(capsys, cluster, tmp_path):
    code, out = run_cli(capsys, "--json", "verify")
    assert code == EXIT_OK and len(json.loads(out)) == 4

    exported = tmp_path / "main_0-v2.safetensors"
    code, _ = run_cli(capsys, "export", "main_0", "2", "-o", str(exported))
    assert code == EXIT_OK
    assert all(torch.equal(load_file(str(exported))[k], v) for k, v in _weights(2).items())

    # A safetensors file keeps its meta (merged with --meta); a torch.save'd state dict loads weights-only.
    code, out = run_cli(capsys, "--json", "import", str(exported), "copy", "--meta", '{"source": "export"}')
    assert code == EXIT_OK and json.loads(out)["meta"] == {"frozen": True, "source": "export"}
    state = tmp_path / "state.pt"
    torch.save(_weights(7), state)
    code, out = run_cli(capsys, "--json", "import", str(state), "copy", "--durable")
    assert code == EXIT_OK and json.loads(out)["version"] == 2
    plain = tmp_path / "plain.safetensors"
    save_file(_weights(8), str(plain))
    code, out = run_cli(capsys, "--json", "import", str(plain), "copy")
    assert code == EXIT_OK and json.loads(out)["version"] == 3

    code, out = run_cli(capsys, "--json", "ls", "copy")
    rows = {r["version"]: r for r in json.loads(out)}
    assert rows[1]["meta"] == {"frozen": True, "source": "export"} and rows[2]["meta"] == {}
    import policystore

    got = policystore.connect().get("copy", 2)
    assert all(torch.equal(got[k], v) for k, v in _weights(7).items())


class _Exploit:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, proof: Path):
        self.proof = proof

    def __reduce__(self):
        return (open, (str(self.proof), "w"))


def test_import_refuses_pickled_code_and_non_weights(capsys, cluster, tmp_path):
    evil, proof = tmp_path / "evil.pt", tmp_path / "code-ran"
    with open(evil, "wb") as f:
        pickle.dump({"w": _Exploit(proof)}, f, protocol=2)
    not_weights = tmp_path / "list.pt"
    torch.save([torch.ones(2)], not_weights)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    for path in (evil, not_weights, garbage, tmp_path / "missing.pt"):
        code, _ = run_cli(capsys, "import", str(path), "bad")
        assert code == EXIT_USAGE, path
    assert not proof.exists()
    code, _ = run_cli(capsys, "ls", "bad")
    assert code == EXIT_USAGE  # nothing was published


@pytest.mark.parametrize("where", ["data", "layout"])
def test_import_refuses_a_file_that_no_longer_matches_its_recorded_checksum(capsys, cluster, tmp_path, where):
    exported = tmp_path / "main_0-v2.safetensors"
    assert run_cli(capsys, "export", "main_0", "2", "-o", str(exported))[0] == EXIT_OK
    raw = bytearray(exported.read_bytes())
    header_end = 8 + int.from_bytes(raw[:8], "little")
    if where == "data":
        raw[-3] ^= 0x01  # one bit of one weight
    else:  # the index changed: a tensor renamed (the file still loads as safetensors)
        name = next(k for k in json.loads(raw[8:header_end]) if k != "__metadata__")
        at = raw.index(f'"{name}":'.encode(), 8, header_end) + 1
        raw[at:at + 1] = b"Z" if name[0] != "Z" else b"Y"
    exported.write_bytes(bytes(raw))
    code, out = run_cli(capsys, "--json", "import", str(exported), "changed")
    assert code == EXIT_USAGE and "checksum recorded in it" in json.loads(out)["error"], out
    code, _ = run_cli(capsys, "ls", "changed")
    assert code == EXIT_USAGE  # nothing was published


def test_import_refuses_meta_that_is_not_an_object_and_folders(capsys, cluster, tmp_path):
    state = tmp_path / "state.pt"
    torch.save(_weights(7), state)
    for meta, why in (("[1]", "must be a JSON object"), ("null", "must be a JSON object"),
                      ('"x"', "must be a JSON object"), ("3", "must be a JSON object"), ("{not json", "is not JSON")):
        code, out = run_cli(capsys, "--json", "import", str(state), "bad", "--meta", meta)
        assert code == EXIT_USAGE and why in json.loads(out)["error"], meta
    code, out = run_cli(capsys, "--json", "import", str(tmp_path), "bad")  # a folder, not a weights file
    assert code == EXIT_USAGE and "is a folder" in json.loads(out)["error"]
    code, _ = run_cli(capsys, "ls", "bad")
    assert code == EXIT_USAGE  # nothing was published


def test_league_option_picks_the_league(capsys, cluster):
    code, out = run_cli(capsys, "--json", "--league", "default", "ls", "expl")
    assert code == EXIT_OK and [r["version"] for r in json.loads(out)] == [1]
    code, out = run_cli(capsys, "--json", "--league", "nosuch", "ls")
    assert code == EXIT_PROBLEM and "no policystore catalog runs for league 'nosuch'" in json.loads(out)["error"]


def test_unreachable_cluster_fails_in_seconds_with_a_message(tmp_path):
    result = run_cli_subprocess("--address", "127.0.0.1:1", "ls", env={"RAY_ADDRESS": ""})
    assert result.returncode == EXIT_PROBLEM, result.stderr
    assert "no Ray cluster answers at 127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr


def test_gc_and_rm_against_the_cluster(capsys, cluster):
    code, out = run_cli(capsys, "--json", "gc", "main_0", "--keep-last", "1", "--keep-meta", "frozen")
    assert code == EXIT_OK and json.loads(out)["deleted"] == ["main_0@v1"]
    code, out = run_cli(capsys, "--json", "ls", "main_0")
    assert [r["version"] for r in json.loads(out)] == [2, 3]

    code, _ = run_cli(capsys, "rm", "expl")  # every version needs --all
    assert code == EXIT_USAGE
    code, out = run_cli(capsys, "--json", "rm", "expl", "--all")
    assert code == EXIT_OK and json.loads(out)["deleted"] == ["expl@v1"]
    code, _ = run_cli(capsys, "ls", "expl")
    assert code == EXIT_USAGE


def test_offline_view_of_the_durable_export_matches_bytes(capsys, durable_dir, tmp_path):
    target = tmp_path / "x.safetensors"
    assert run_cli(capsys, "--dir", f"file://{durable_dir}", "export", "expl", "-o", str(target))[0] == EXIT_OK
    tier = DurableTier.open(str(durable_dir))
    assert np.array_equal(np.fromfile(target, dtype=np.uint8), tier.read(SnapshotId("expl", 1)))


def test_verify_against_the_cluster_finds_a_damaged_spill_file(capsys, cluster, spill_root):
    [spilled] = (spill_root / "main_0").glob("0000000003.safetensors*")
    raw = bytearray(spilled.read_bytes())
    raw[-3] ^= 0xFF
    spilled.write_bytes(bytes(raw))
    code, out = run_cli(capsys, "--json", "verify", "main_0", "3")
    assert code == EXIT_PROBLEM
    [result] = json.loads(out)
    assert not result["ok"] and result["problems"]
    code, _ = run_cli(capsys, "verify", "main_0", "2")
    assert code == EXIT_OK


def test_offline_on_object_storage(capsys, s3_server, tmp_path):
    """--dir with an s3:// URI: the durable tier read straight from a real S3-compatible server."""
    uri = f"s3://{s3_server.bucket}/cli?endpoint_override=127.0.0.1:{s3_server.port}&scheme=http&region=us-east-1"
    tier = DurableTier.open(uri)
    buf = pack(_weights(4), policy_id="remote", meta={"frozen": True})
    tier.write(SnapshotId("remote", 4), buf, parse_header(buf, name="remote"))
    code, out = run_cli(capsys, "--json", "--dir", uri, "ls")
    assert code == EXIT_OK and [(r["policy_id"], r["version"], r["meta"]) for r in json.loads(out)] == [
        ("remote", 4, {"frozen": True})]
    code, out = run_cli(capsys, "--json", "--dir", uri, "verify")
    assert code == EXIT_OK and json.loads(out)[0]["ok"]
    target = tmp_path / "remote.safetensors"
    assert run_cli(capsys, "--dir", uri, "export", "remote", "-o", str(target))[0] == EXIT_OK
    assert all(torch.equal(load_file(str(target))[k], v) for k, v in _weights(4).items())
    code, _ = run_cli(capsys, "--dir", f"s3://{s3_server.bucket}/cli?endpoint_override=127.0.0.1:1&scheme=http", "ls")
    assert code == EXIT_PROBLEM  # storage unreachable
