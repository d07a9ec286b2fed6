"""ibtool mesh's faces: the heat map (by endpoint, by node, in bins of nodes), the text report,
the streamed JSON, the node_exporter textfile (promtool checks it) and the PNG."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from ibtool.errors import ExitCode, UnsupportedError
from ibtool.model import mesh as mesh_model
from ibtool.model.mesh import Health
from ibtool.views import mesh as view
from tests.fixtures import meshes

SGR = re.compile(r"\x1b\[[0-9;]*m")
N = "node{:02d}/mlx5_0/1".format


def grid(lines: list[str]) -> dict[str, str]:
    """The heat map's rows: label -> its cells as printed (from the column of index 0)."""
    first = next(k for k, line in enumerate(lines) if re.match(r"^\s*0 [^\s\d]", line))
    start = lines[first - 1].index("0")  # the header's units line, over the cells
    rows = {}
    for line in lines[first:]:
        m = re.match(r"^\s*\d+ (\S+)", line)
        if not m or len(line) > start and line[start - 1] != " ":
            break
        rows[m.group(1)] = line[start:]
    return rows


def cells(glyphs: str, spaced: bool = True) -> str:
    return glyphs[::2] if spaced else glyphs


@pytest.fixture(scope="module")
def faulty():
    """4 endpoints: node02 down, a lossy path node01 -> node04."""
    return meshes.build(4, 1, down=(N(2),), lossy=((N(1), N(4)),))


def test_four_endpoints_each_pair_in_its_cell(faulty):
    lines = view.heat_map(faulty)
    rows = grid(lines)
    assert list(rows) == [f"node0{k}/mlx5_0" for k in range(1, 5)]
    assert cells(rows["node01/mlx5_0"]) == "\\X.l"
    assert cells(rows["node02/mlx5_0"]) == "X\\XX"  # a DOWN port: FAILED both ways
    assert cells(rows["node04/mlx5_0"]) == ".X.\\"
    assert lines[-1] == view.LEGEND
    assert "row = source, column = destination" in lines[0]
    assert all(len(line) <= 80 for line in lines)


def test_a_slow_endpoint_is_s_both_ways():
    r = meshes.build(6, 1, slow=(N(3),))
    rows = grid(view.heat_map(r))
    assert cells(rows["node03/mlx5_0"]) == "ss\\sss"
    assert {cells(g)[2] for k, g in rows.items() if k != "node03/mlx5_0"} == {"s"}
    assert cells(rows["node01/mlx5_0"]) == "\\.s..."
    assert [v.subject for v in r.verdicts] == [N(3)]


def test_the_color_is_on_top_of_the_glyphs(faulty):
    plain = view.heat_map(faulty)
    colored = view.heat_map(faulty, color=True)
    assert colored != plain
    assert [SGR.sub("", line) for line in colored] == plain
    assert "\x1b[1;31mX" in "".join(colored)  # FAILED red
    assert "\x1b[35ml" in "".join(colored)  # LOSSY magenta
    assert "\x1b[32m." in "".join(colored)  # OK green


def test_sixteen_endpoints_fit_80_columns():
    r = meshes.build(16, 1, down=(N(5),))
    lines = view.heat_map(r, width=80)
    assert max(len(line) for line in lines) <= 80
    rows = grid(lines)
    assert len(rows) == 16
    assert cells(rows["node05/mlx5_0"]) == "XXXX\\" + "X" * 11
    assert all(cells(g)[4] == "X" for k, g in rows.items() if k != "node05/mlx5_0")
    # the columns' indices, written down over the cells
    assert lines[1].strip().split() == ["1"] * 6 and lines[2].split()[:3] == ["0", "1", "2"]
    for text in view.render_text(r, width=80):
        assert len(text) <= 80 or not text.startswith((" ", "0", "1"))  # the map's own lines


def test_rails_never_meet_in_rail_mode():
    r = meshes.build(4, 4)
    rows = grid(view.heat_map(r))
    # rail by rail: each rail a block on the diagonal, the other rails' columns blank
    assert cells(rows["node01/mlx5_0"]).rstrip() == "\\..."
    assert cells(rows["node01/mlx5_1"]) == "    \\..."


def test_all_rails_meets_everyone():
    r = meshes.build(2, 2, all_rails=True)
    rows = grid(view.heat_map(r))
    assert cells(rows["node01/mlx5_0"]) == "\\..."


def test_folded_by_node():
    """4 nodes x 8 rails in 40 columns: a cell a node pair, its worst pair's health."""
    r = meshes.build(4, 8, down=("node02/mlx5_3/1",))
    lines = view.heat_map(r, width=40)
    assert max(len(line) for line in lines) <= 40
    rows = grid(lines)
    assert list(rows) == ["node01", "node02", "node03", "node04"]
    assert cells(rows["node01"]) == "\\X.."
    assert cells(rows["node02"]) == "X\\XX"
    assert "each cell: a node to a node, the worst of their pairs" in " ".join(lines)
    f = mesh_model.fold(r, 4)
    assert f.unit == "node" and f.total == 4 and f.cells[2][3] == Health.OK


def test_forty_nodes_of_8_rails_fold_by_node_at_80():
    r = meshes.build(40, 8, rounds=3)
    lines = view.heat_map(r, width=80)
    assert max(len(line) for line in lines) <= 80
    assert len(grid(lines)) == 40


@pytest.fixture(scope="module")
def huge():
    return meshes.big(1024, 8, rounds=4, failed_node=5)


def test_1024_nodes_binned(huge):
    for width in (80, 120, 200):
        lines = view.heat_map(huge, width=width)
        assert max(len(line) for line in lines) <= width
        bins = [line for line in lines if line.startswith("each cell: ")]
        assert bins, lines[-3:]
        per = int(bins[0].split()[2])
        assert len(grid(lines)) == -(-1024 // per)
    lines = view.heat_map(huge, width=80)
    rows = grid(lines)
    assert cells(next(iter(rows.values())), spaced=False)[0] == "X"  # gpu0006 in bin 0
    assert lines[0].startswith("heat map of 1,024 nodes: row = source, column = destination")


def test_refold_keeps_the_worst():
    f = mesh_model.Fold(
        "endpoint",
        1,
        ("a", "b", "c", "d"),
        (
            (mesh_model.SELF, Health.OK, mesh_model.NONE, Health.OK),
            (Health.SLOW, mesh_model.SELF, Health.OK, Health.OK),
            (mesh_model.NONE, mesh_model.NONE, mesh_model.SELF, Health.LOSSY),
            (Health.OK, Health.OK, Health.OK, mesh_model.SELF),
        ),
        4,
    )
    g = mesh_model.refold(f, 2)
    assert g.labels == ("a", "c") and g.per_cell == 2
    assert g.rows() == ["s.", ".l"]
    assert mesh_model.refold(
        mesh_model.Fold("node", 1, ("a", "b"), ((mesh_model.SELF, mesh_model.NONE),) * 2, 2), 1
    ).rows() == ["\\"]


def test_report_of_a_faulty_mesh(faulty):
    lines = view.render_text(faulty)
    assert lines[0].startswith("mesh: 4 endpoints on 4 nodes, rail 0, 3 rounds, 6 pairs probed")
    assert "20 pings a pair" in lines[0] and "clustershell" in lines[0] and "12.3 s" in lines[0]
    assert "rail 0: median 3.4 us, p90 4.0 us over 6 pairs" in lines
    fail = [i for i, line in enumerate(lines) if line.startswith("FAIL ")]
    assert lines[fail[0]].startswith("FAIL endpoint node02/mlx5_0/1: port DOWN")
    assert lines[fail[0] + 1].startswith("  next: on node01: ibtool ping --server")
    assert lines[fail[1]].startswith("FAIL path node01/mlx5_0/1 <-> node04/mlx5_0/1: bad one way")
    assert lines[-1] == "mesh: 2 FAIL verdicts over 4 endpoints"


def test_warn_after_fail_and_unreachable():
    r = meshes.build(8, 1, slow=(N(3),), down=(N(6),), unreachable=("node08",))
    lines = view.render_text(r)
    levels = [line.split()[0] for line in lines if line.startswith(("FAIL ", "WARN "))]
    assert levels == sorted(levels)  # FAIL < WARN alphabetically, and FAIL first
    assert levels[-1] == "WARN"
    assert "unreachable (no agent): node08" in lines
    assert re.fullmatch(r"mesh: \d+ FAIL, 1 WARN verdicts over 8 endpoints", lines[-1])


def test_healthy_summary():
    r = meshes.build(6, 2)
    last = view.render_text(r)[-1]
    assert last.startswith("mesh healthy: 12 endpoints, 60 pairs, every ping answered, RTT median")
    assert re.search(r"RTT median \d+\.\d us p99 \d+\.\d us$", last)


def test_verdicts_capped_at_40():
    # 60 nodes, each with its own lossy path to the next: 60 path verdicts
    names = [N(k) for k in range(1, 61)]
    lossy = [(names[k], names[(k + 1) % 60]) for k in range(60)]
    r = meshes.build(60, 1, rounds=59, lossy=lossy)
    assert len(r.verdicts) > 40
    lines = view.verdict_lines(r.verdicts)
    assert sum(1 for line in lines if line.startswith(("FAIL ", "WARN "))) == 40
    assert lines[-1] == f"... and {len(r.verdicts) - 40} more: -j lists them all"


def test_us():
    assert [view.us(x) for x in (None, 3.21, 812.4, 67100.0)] == [
        "-",
        "3.2 us",
        "812 us",
        "67.1 ms",
    ]


def test_json_document(faulty):
    chunks = list(view.json_chunks(faulty))
    doc = json.loads("".join(chunks))
    assert set(doc) >= {
        "settings", "endpoints", "baselines", "verdicts", "unreachable", "rounds", "elapsed",
        "pairs",
    }  # fmt: skip
    assert doc["settings"]["engine"] == "clustershell" and doc["settings"]["count"] == 20
    e = doc["endpoints"][1]
    assert e["name"] == N(2) and e["state"] == "DOWN" and e["device"] == "mlx5_0"
    assert {"node", "port", "rail", "address", "link_layer", "hw_timestamps"} <= set(e)
    assert len(doc["pairs"]) == 12
    p = next(p for p in doc["pairs"] if p["src"] == N(1) and p["dst"] == N(4))
    assert p["sent"] == 20 and p["received"] == 10 and p["health"] == "LOSSY"
    assert p["state"] == "PROBED" and p["rtt_median_us"] == 3.1 and p["hw"] is True
    assert {"round", "rtt_p90_us", "rtt_p99_us", "error"} <= set(p)
    down = next(p for p in doc["pairs"] if p["dst"] == N(2))
    assert down["state"] == "SKIPPED" and down["health"] == "FAILED" and down["error"]
    assert down["rtt_median_us"] is None
    v = doc["verdicts"][0]
    assert v["culprit"] == "endpoint" and v["level"] == "FAIL" and v["endpoints"] == [N(2)]
    assert v["next"] and v["why"]
    assert doc["baselines"][0]["group"] == "rail 0"


def test_json_streams_the_pairs_in_chunks(huge):
    it = view.json_chunks(huge)
    first = next(it)
    assert '"pairs": [' in first and len(first) < 4_000_000
    sizes = []
    count = 0
    for chunk in it:
        sizes.append(len(chunk))
        count += chunk.count('"src"')
    assert count == 32768
    assert max(sizes) < 2 * view.CHUNK * 400  # no chunk holds the whole list


def test_textfile_families_and_escaping(faulty):
    text = view.textfile(faulty)
    for name in (
        "ibtool_mesh_pair_rtt_seconds",
        "ibtool_mesh_pair_pings_sent",
        "ibtool_mesh_pair_pings_received",
        "ibtool_mesh_pair_up",
        "ibtool_mesh_verdict",
        "ibtool_mesh_endpoints",
        "ibtool_mesh_last_run_timestamp_seconds",
        "ibtool_mesh_duration_seconds",
    ):
        assert f"# TYPE {name} gauge\n" in text and f"# HELP {name} " in text
    assert (
        'ibtool_mesh_pair_up{dst="node04/mlx5_0/1",dst_node="node04",rail="0",'
        'src="node01/mlx5_0/1",src_node="node01"} 0.0'
    ) in text
    assert 'percentile="99"' in text
    assert (
        'ibtool_mesh_verdict{culprit="endpoint",level="FAIL",subject="node02/mlx5_0/1"} 1.0' in text
    )
    assert "ibtool_mesh_endpoints 4.0\n" in text


def test_textfile_label_values_escaped():
    r = meshes.build(3, 1, node_name='n"{}\\x')
    text = view.textfile(r)
    assert 'src_node="n\\"1\\\\x"' in text


def test_textfile_past_the_cap_only_bad_pairs(faulty):
    text = view.textfile(faulty, max_pairs=4)
    ups = [line for line in text.splitlines() if line.startswith("ibtool_mesh_pair_up{")]
    assert len(ups) == 7 and all(line.endswith(" 0.0") for line in ups)
    assert "ibtool_mesh_pairs_exported 7.0" in text


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool is not installed")
@pytest.mark.parametrize("which", ["faulty", "escaped", "healthy"])
def test_promtool_accepts_the_textfile(which, faulty, tmp_path):
    r = {
        "faulty": lambda: faulty,
        "escaped": lambda: meshes.build(3, 1, node_name='n"{}\\x\n'),
        "healthy": lambda: meshes.build(4, 2),
    }[which]()
    out = subprocess.run(
        ["promtool", "check", "metrics"], input=view.textfile(r), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


# -- the PNG -----------------------------------------------------------------------------------


def test_plot_without_matplotlib(monkeypatch, faulty, tmp_path):
    import builtins

    from ibtool.views import mesh_plot

    real = builtins.__import__

    def no_matplotlib(name, *a, **kw):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(UnsupportedError) as e:
        mesh_plot.plot(faulty, str(tmp_path / "m.png"))
    assert e.value.exit_code == ExitCode.UNSUPPORTED
    assert "matplotlib" in e.value.message and "\n" not in e.value.message
    assert "apt install python3-matplotlib" in e.value.hint and "ibtool[plot]" in e.value.hint
    with pytest.raises(UnsupportedError):
        mesh_plot.require()
    assert not (tmp_path / "m.png").exists()


@pytest.mark.parametrize("which", ["faulty", "nodes"])
def test_plot_png(which, faulty, tmp_path):
    pytest.importorskip("matplotlib")
    from ibtool.views import mesh_plot

    r = faulty if which == "faulty" else meshes.build(80, 2, rounds=5, down=("node07/mlx5_1/1",))
    path = tmp_path / "mesh.png"
    mesh_plot.plot(r, str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_json_pairs_as_the_table_holds_them():
    """Each pair written by hand reads back as the table's Pair (an error with quotes and
    control characters escaped, NaN as null)."""
    r = meshes.build(5, 1, down=(N(3),), lossy=((N(1), N(2)),))
    t = r.pairs
    odd = next(i for i in t.slots() if t.errors.get(i))
    t.errors[odd] = 'say "hi"\n\x1b[31m\\ end'
    doc = json.loads("".join(view.json_chunks(r)))
    names = [e.name for e in r.endpoints]
    for i, got in zip(t.slots(), doc["pairs"]):
        p = t.get(i)
        assert got == {
            "src": names[p.src],
            "dst": names[p.dst],
            "round": p.round,
            "state": p.state.name,
            "sent": p.sent,
            "received": p.received,
            "rtt_median_us": None if p.median_us is None else round(p.median_us, 3),
            "rtt_p90_us": None if p.p90_us is None else round(p.p90_us, 3),
            "rtt_p99_us": None if p.p99_us is None else round(p.p99_us, 3),
            "hw": p.hw,
            "error": p.error,
            "full_payload": p.full.name,
            "health": p.health.name,
        }
    assert 'say "hi"\n\x1b[31m\\ end' in [p["error"] for p in doc["pairs"]]


@pytest.mark.parametrize("width", [20, 33, 40, 57, 80, 101, 160, 300])
@pytest.mark.parametrize("shape", [(2, 1), (16, 1), (4, 8), (40, 8), (130, 1)])
def test_no_line_wider_than_asked(width, shape):
    r = meshes.build(*shape, rounds=5, down=(N(2),))
    for color in (False, True):
        lines = view.heat_map(r, width=width, color=color)
        assert max(len(SGR.sub("", line)) for line in lines) <= width
    assert len(grid(view.heat_map(r, width=width))) >= 1
