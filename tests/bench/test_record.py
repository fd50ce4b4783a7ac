"""Every generated section's record: its header, raw file, markers and ``--from-raw``."""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.machine import Machine, core_speed, git_state
from bench.record import (
    REPO_ROOT,
    SCRATCH_DIR,
    Recording,
    RunInfo,
    Section,
    add_record_arguments,
    command_line,
    header,
    load_raw,
    rerender,
    write_section,
)

MACHINE = Machine(
    cores=2,
    cpu_model="Test CPU",
    memory_gb=23.5,
    java_version='openjdk version "17.0.15"',
    pyspark_version="4.3.0",
    python_version="3.11.7",
    os="Debian GNU/Linux 12 (bookworm), kernel 6.1 (x86_64)",
    load_average=(0.5, 1.25, 2.0),
)


def info(**changes: object) -> RunInfo:
    base = {
        "name": "demo",
        "command": "python -m bench.demo --seconds 5",
        "commit": "0123456789ab",
        "changed": [],
        "started": "2026-11-24T14:54:03+00:00",
        "ended": "2026-11-24T15:19:45+00:00",
        "machine": MACHINE,
        "load_after": (1.5, 1.0, 0.75),
        "busy_cores": 1.62,
        "raw": "bench/results/demo-20261124T145403Z.json.gz",
    }
    return RunInfo(**{**base, **changes})  # type: ignore[arg-type]


def render_demo(data: dict) -> str:
    return "\n".join(f"| {k} | {v} |" for k, v in sorted(data["figures"].items()))


DEMO = Section(
    "demo", "tests.bench.test_record", "A demo bench", render_demo, about="What it does."
)


# -- the header ------------------------------------------------------------------------------


def test_the_header_says_commit_tree_times_duration_machine_load_and_raw_file():
    text = header(info())
    assert "at commit `0123456789ab` (clean tree)" in text
    assert "**Ran** 2026-11-24 14:54:03 to 15:19:45 UTC (25.7 min)" in text
    assert "`python -m bench.demo --seconds 5` (from the repository's root)" in text
    for fact in ("2 cores (Test CPU)", "23.5 GB", "Debian GNU/Linux 12", "Python 3.11.7",
                 "PySpark 4.3.0", 'Java: openjdk version "17.0.15"'):  # fmt: skip
        assert fact in text
    assert "0.50 / 1.25 / 2.00 before, 1.50 / 1.00 / 0.75 after" in text
    assert "busy cores during the run 1.62 of 2" in text
    raw = "bench/results/demo-20261124T145403Z.json.gz"
    assert f"[`{raw}`]({raw})" in text and f"python -m bench.run --from-raw {raw}" in text
    assert "Smoke run" not in text


def test_the_header_names_a_dirty_tree_a_run_past_midnight_and_a_smoke_run():
    changed = [f"bench/m{i}.py" for i in range(7)]
    text = header(
        info(changed=changed, ended="2026-11-25T01:10:00+00:00", busy_cores=None, smoke=True)
    )
    assert "**dirty tree**: uncommitted changes to `bench/m0.py`" in text
    assert "`bench/m4.py` and 2 more" in text and "`bench/m5.py`" not in text
    assert "to 2026-11-25 01:10:00 UTC (10.27 h)" in text
    assert "busy cores during the run -" in text
    assert text.startswith("- **Smoke run**")


def test_the_header_gives_the_hosts_core_speed_when_the_record_has_it():
    """Older records have no core speed: their header says nothing of it."""
    assert "M steps/s" not in header(info())
    fast = info(machine=dataclasses.replace(MACHINE, core_speed=28.04))
    assert "2 cores (Test CPU; one core runs 28.0 M steps/s of `bench.machine.core_speed`)" in (
        header(fast)
    )


def test_core_speed_is_a_positive_rate():
    assert core_speed(repeats=1) > 0


def test_commands_name_paths_inside_the_repository_relative_to_it():
    absolute = str(REPO_ROOT / "BENCHMARKS.md")
    line = command_line("python -m bench.run", ["--output", absolute, "--x=" + absolute, "/tmp/a"])
    assert line == "python -m bench.run --output BENCHMARKS.md --x=BENCHMARKS.md /tmp/a"
    assert str(REPO_ROOT) not in line


def test_run_info_round_trips_through_json():
    original = info(changed=["a.py"], smoke=True)
    assert RunInfo.from_dict(json.loads(json.dumps(original.to_dict()))) == original


# -- the commit and the tree ------------------------------------------------------------------


def test_git_state_lists_changed_paths_but_not_the_records_themselves(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.invalid")
    git("config", "user.name", "t")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "BENCHMARKS.md").write_text("# B\n")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    commit, changed = git_state(tmp_path)
    assert len(commit) == 12 and changed == []
    (tmp_path / "BENCHMARKS.md").write_text("# B\n\nnew section\n")
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "x.json.gz").write_bytes(b"")
    assert git_state(tmp_path)[1] == []  # a run's own outputs do not make the tree dirty
    (tmp_path / "code.py").write_text("x = 2\n")
    (tmp_path / "new.py").write_text("")
    assert sorted(git_state(tmp_path)[1]) == ["code.py", "new.py"]
    assert git_state(tmp_path / "no-such-dir")[0].startswith("unknown")


# -- the markers ------------------------------------------------------------------------------


def test_a_hand_written_paragraph_between_sections_survives_a_rewrite_byte_for_byte(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    write_section(path, "first", "## First\n\nold figures", preamble="# Benchmarks\n")
    hand = "\nA hand-written paragraph,\ttabs, trailing spaces   \n\n  and odd  spacing.\n\n"
    path.write_text(path.read_text() + hand)
    write_section(path, "second", "## Second\n\nfigures")
    before = path.read_text()
    write_section(path, "first", "## First\n\nnew figures\nover two lines")
    after = path.read_text()
    assert "old figures" not in after and "new figures\nover two lines" in after
    # Everything outside the first section's markers is the same bytes as before.
    cut = before.index("<!-- end: first -->\n") + len("<!-- end: first -->\n")
    assert after.endswith(before[cut:]) and hand in after
    assert after.startswith("# Benchmarks\n\n<!-- generated: first ")
    assert after.index("<!-- end: first -->") < after.index(hand) < after.index("second")


def test_a_section_is_replaced_whole_in_place_and_a_new_one_appended(tmp_path):
    path = tmp_path / "R.md"
    path.write_text("# Top, by hand\n")
    write_section(path, "a", "A1")
    write_section(path, "b", "B1")
    write_section(path, "a", "A2")
    text = path.read_text()
    assert text.count("<!-- generated: a ") == 1 and "A1" not in text
    assert text.index("A2") < text.index("B1")  # in place, not moved to the end
    assert text.startswith("# Top, by hand\n\n")
    write_section(path, "a.b", "AB")  # a name that contains another is its own section
    assert "A2" in path.read_text() and "AB" in path.read_text()


def test_a_file_with_a_section_twice_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "B.md"
    write_section(path, "a", "one")
    path.write_text(path.read_text() * 2)
    with pytest.raises(ValueError, match="has section 'a' 2 times; keep one"):
        write_section(path, "a", "two")
    with pytest.raises(ValueError, match="must match"):
        write_section(path, "no spaces", "x")


# -- a recorded run ---------------------------------------------------------------------------


def _args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    add_record_arguments(p)
    return p.parse_args([*argv, "--results-dir", str(tmp_path / "res")])


def test_a_recorded_run_writes_its_raw_file_and_section(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\nBy hand.\n")
    argv = ["--output", str(out)]
    with Recording(DEMO, "python -m bench.demo", argv, _args(tmp_path, *argv)) as rec:
        data = {"figures": {"rate": 5_297, "ratio": (0.5, 0.75)}}
    run = rec.finish(data)
    (raw,) = (tmp_path / "res").iterdir()
    assert raw.name == f"demo-{run.started[:19].replace('-', '').replace(':', '')}Z.json.gz"
    module, stored, saved = load_raw(raw)
    assert module == "tests.bench.test_record" and stored == run
    assert saved == {"figures": {"rate": 5_297, "ratio": [0.5, 0.75]}}  # as JSON holds it
    assert gzip.decompress(raw.read_bytes()).startswith(b'{"data":')  # compact JSON, gzip
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nBy hand.\n\n<!-- generated: demo ")
    assert "## A demo bench\n\n- **Ran** " in text
    assert "\n\nWhat it does.\n\n| rate | 5297 |\n| ratio | [0.5, 0.75] |\n" in text
    assert f"`python -m bench.demo --output {out}`" in text
    assert run.raw == str(raw) and f"--from-raw {raw}`" in text


def test_a_section_renders_again_from_its_raw_file_byte_for_byte(tmp_path):
    from dataclasses import asdict

    from bench.tracker_bench import SECTION, TrackerResult

    out = tmp_path / "BENCHMARKS.md"
    argv = ["--output", str(out)]
    result = TrackerResult(1000, 5.0, 4, 20.0, 100_000, 96_000, 0, 100_000, 800.0, 3_700.0,
                           5_600.0, 1_300.0, 99.0, 82.0, calls=35_000,
                           steady_accepted_rate=4_972)  # fmt: skip
    data = {"target_per_s": 5000, "runs": [{**asdict(result), "repeat": 1}]}
    with Recording(SECTION, "python -m bench.tracker_bench", argv, _args(tmp_path, *argv)) as rec:
        pass
    rec.finish(data)
    (raw,) = (tmp_path / "res").iterdir()
    first = out.read_text()
    assert "| 1,000 x 5 | 4,972 (1 run) | **not met**: met in 0 of 1 runs, missed in 1 |" in first
    out.write_text(first.replace("4,972 (1 run)", "5,297 (edited by hand)"))
    target, text = rerender(raw, out)
    assert target == out
    assert out.read_text() == first  # the same section, byte for byte, from the raw file
    assert text in first


def test_bench_run_from_raw_with_no_write_prints_the_section_and_writes_nothing(tmp_path, capsys):
    from bench.run import main
    from bench.tracker_bench import SECTION

    out = tmp_path / "BENCHMARKS.md"
    argv = ["--output", str(out)]
    with Recording(SECTION, "python -m bench.tracker_bench", argv, _args(tmp_path, *argv)) as rec:
        pass
    rec.finish({"target_per_s": 5000, "runs": []})
    (raw,) = (tmp_path / "res").iterdir()
    out.write_text("# Benchmarks\n\nEdited by hand.\n")
    assert main(["--from-raw", str(raw), "--output", str(out), "--no-write"]) == 0
    assert "## Tracker" in capsys.readouterr().out  # the section, printed
    assert out.read_text() == "# Benchmarks\n\nEdited by hand.\n"  # nothing written


def test_a_smoke_run_publishes_under_bench_out_and_no_write_publishes_nothing(tmp_path):
    smoke = Recording(DEMO, "python -m bench.demo", [], _args(tmp_path, "--quick"))
    assert smoke.output == SCRATCH_DIR / "BENCHMARKS.md" and smoke.smoke
    quiet = Recording(DEMO, "python -m bench.demo", [], _args(tmp_path, "--no-write"))
    assert quiet.output is None
    full = Recording(DEMO, "python -m bench.demo", [], _args(tmp_path))
    assert full.output == REPO_ROOT / "BENCHMARKS.md" and not full.smoke


def test_finish_before_the_end_of_the_run_is_refused(tmp_path):
    rec = Recording(DEMO, "python -m bench.demo", [], _args(tmp_path, "--no-write"))
    with pytest.raises(RuntimeError, match="must follow the end of its `with` block"):
        rec.finish({})


def test_from_raw_refuses_what_is_not_a_raw_file_of_this_format(tmp_path):
    old = tmp_path / "throughput-20261124T145400Z.json"
    old.write_text(json.dumps({"steps": []}))
    with pytest.raises(ValueError, match="not a gzip'd JSON raw file"):
        load_raw(old)
    older = tmp_path / "x.json.gz"
    older.write_bytes(gzip.compress(json.dumps({"steps": []}).encode()))
    with pytest.raises(ValueError, match="raw files of runs before issue 30"):
        load_raw(older)
    foreign = tmp_path / "y.json.gz"
    doc = {"format": 1, "module": "os", "run": info().to_dict(), "data": {}}
    foreign.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(ValueError, match=r"only bench\.\* and reliability\.\* render"):
        rerender(foreign, tmp_path / "B.md")


def test_bench_run_from_raw_says_what_is_wrong_and_exits_2(tmp_path, capsys):
    from bench.run import main

    bad = tmp_path / "x.json.gz"
    bad.write_bytes(b"not gzip")
    assert main(["--from-raw", str(bad), "--output", str(tmp_path / "B.md")]) == 2
    assert "is not a gzip'd JSON raw file" in capsys.readouterr().err


def test_every_section_of_make_bench_and_the_reliability_runs_can_render_from_raw():
    import importlib

    from bench.record import section_of
    from bench.run import SECTIONS

    for name, module in [*SECTIONS.items(), ("soak", "reliability.soak"),
                         ("chaos", "reliability.chaos")]:  # fmt: skip
        section = section_of(module, name)
        assert section.module == module and importlib.import_module(module).main


@pytest.mark.parametrize(
    ("file", "names"),
    [
        ("BENCHMARKS.md", None),  # every section of make bench
        ("RELIABILITY.md", ["chaos", "soak"]),
    ],
)
def test_the_records_hold_hand_written_text_at_the_top_only_and_each_section_once(file, names):
    import re

    from bench.record import generated_names
    from bench.run import SECTIONS

    text = (REPO_ROOT / file).read_text()
    found = generated_names(text)
    assert sorted(found) == sorted(names or SECTIONS) and len(set(found)) == len(found)
    first = re.search(r"^<!-- generated: ", text, re.M).start()  # type: ignore[union-attr]
    assert text[:first].startswith("# ") and not re.search(r"^<!-- end:", text[:first], re.M)
    # After the top, nothing but generated sections: no hand-written heading or paragraph
    # between, under or after them.
    rest = re.sub(r"<!-- generated: ([\w.-]+) .*?<!-- end: \1 -->\n", "", text[first:], flags=re.S)
    assert rest.strip() == ""
