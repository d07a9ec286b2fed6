"""`ibtool ping --cm`: what rides in the rdma_cm private data (REQ, REP, REJ), its validation
against garbage and non-ibtool peers, and the command line of --cm."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ibtool_plugins.ping import options

from ibtool.api.datapath import path_spec
from ibtool.errors import ExitCode, UsageError
from ibtool.rdma import cm, wire
from ibtool.rdma.ladder import PathSpec
from ibtool.rdma.wire import CmMessage, CmOffer, Mode, ProtocolError

MAX = 1 << 20
WRITE = CmOffer(Mode.WRITE_IMM, 256, 0x55B783FA5DA0, 0x898)


def padded(data: bytes, room: int) -> bytes:
    """As the CM hands it over on InfiniBand and RoCE: the whole private data area."""
    return data + bytes(room - len(data))


def test_a_request_is_28_big_endian_bytes_and_fits_a_req():
    raw = wire.encode_cm(CmMessage.REQUEST, WRITE)
    assert raw == bytes.fromhex("4942434d010100140200000000000100000055b783fa5da000000898")
    assert len(raw) <= wire.CM_REQ_ROOM
    assert wire.decode_cm(padded(raw, wire.CM_REQ_ROOM), CmMessage.REQUEST, MAX) == WRITE
    assert wire.decode_cm(raw, CmMessage.REQUEST, MAX) == WRITE  # iWARP: the exact length


def test_an_accept_decodes_from_a_whole_rep_area():
    offer = CmOffer(Mode.SEND, 64)
    raw = padded(wire.encode_cm(CmMessage.ACCEPT, offer), wire.CM_REP_ROOM)
    assert wire.decode_cm(raw, CmMessage.ACCEPT, MAX) == offer


def test_a_refusal_is_cut_to_fit_a_rej_and_made_printable():
    raw = wire.encode_cm(CmMessage.REFUSE, "bad \x1b[31m" + "x" * 300)
    assert len(raw) == wire.CM_REJ_ROOM
    reason = wire.decode_cm(padded(raw, wire.CM_REJ_ROOM), CmMessage.REFUSE, 0)
    assert reason.startswith("bad \\x1b[31m") and len(reason) <= wire.MAX_TEXT + 3


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "no ibtool data in the connection (0 bytes, all zero)"),
        # The REJ of a CM with no listener on the port: the whole area, zeros.
        (bytes(148), "no ibtool data in the connection (148 bytes, all zero)"),
        (b"IBCM\x01", "5 bytes of private data, shorter than a header"),
        (padded(b"IBTP\x01\x01\x00\x00", 56), "not an ibtool ping --cm peer (magic b'IBTP')"),
        (padded(b"IBCM\x02\x01\x00\x14", 56), "ping --cm protocol version 2, this ibtool speaks 1"),
        (padded(b"IBCM\x01\x02\x00\x14", 56), "expected REQUEST, got ACCEPT"),
        (padded(b"IBCM\x01\x09\x00\x14", 56), "expected REQUEST, got 9"),
        (padded(b"IBCM\x01\x01\x00\x40", 56), "length field says 64, 48 bytes came"),
        (padded(b"IBCM\x01\x01\x00\x10" + bytes(16), 56), "REQUEST of 16 bytes, want 20"),
    ],
)
def test_what_is_not_an_ibtool_request_is_refused_in_one_line(data, message):
    with pytest.raises(ProtocolError) as err:
        wire.decode_cm(data, CmMessage.REQUEST, MAX)
    assert err.value.message == message
    assert err.value.exit_code == ExitCode.DATA_ERROR


def offer_bytes(mode: int, size: int, addr: int = 0, rkey: int = 0) -> bytes:
    body = wire.CM_OFFER.pack(mode, size, addr, rkey)
    return wire.HEADER.pack(wire.CM_MAGIC, wire.CM_VERSION, CmMessage.REQUEST, len(body)) + body


@pytest.mark.parametrize(
    "raw, message",
    [
        (offer_bytes(3, 64), "unknown mode 3"),
        (offer_bytes(1, 0), f"ping size 0 not in 1..{MAX}"),
        (offer_bytes(1, MAX + 1), f"ping size {MAX + 1} not in 1..{MAX}"),
        (offer_bytes(1, 64, 0x1000, 0x12), "a buffer advertised in SEND mode"),
        (offer_bytes(2, 64, 2**64 - 8, 0x12), "buffer wraps around the address space"),
        (offer_bytes(1, 64) + b"\x00\x01", "2 bytes after the message are not zero padding"),
    ],
)
def test_a_request_with_bad_fields_is_refused(raw, message):
    with pytest.raises(ProtocolError) as err:
        wire.decode_cm(raw, CmMessage.REQUEST, MAX)
    assert err.value.message == message


@given(st.binary(max_size=wire.CM_REP_ROOM))
def test_any_private_data_decodes_or_raises_protocol_error(data):
    for kind in CmMessage:
        try:
            wire.decode_cm(data, kind, MAX)
        except ProtocolError as e:
            assert "\n" not in e.message


@given(
    st.builds(
        CmOffer,
        mode=st.sampled_from(Mode),
        size=st.integers(1, MAX),
        addr=st.integers(0, 1 << 62),
        rkey=st.integers(0, (1 << 32) - 1),
    )
)
def test_every_valid_offer_round_trips(offer):
    if offer.mode == Mode.SEND:
        offer = CmOffer(Mode.SEND, offer.size)
    raw = wire.encode_cm(CmMessage.ACCEPT, offer)
    assert wire.decode_cm(padded(raw, wire.CM_REP_ROOM), CmMessage.ACCEPT, MAX) == offer


# -- the command line --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cm", "--compat", "rping", "h"], "--cm with --compat rping"),
        (["--cm", "--dev", "rxe0", "h"], "--cm takes no --dev or --gid-index"),
        (["--cm", "--gid-index", "1", "h"], "--cm takes no --dev or --gid-index"),
        (["--cm", "--server"], "--server --cm needs --bind ADDR"),
    ],
)
def test_cm_options_that_cannot_work_are_refused(args, message):
    parser = argparse.ArgumentParser()
    options.configure(parser)
    with pytest.raises(UsageError) as err:
        options.settle(parser.parse_args(args))
    assert err.value.message == message
    assert err.value.hint


@pytest.mark.parametrize("side", [["h"], ["--server", "--bind", "192.0.2.1"]])
def test_cm_takes_a_service_level_traffic_class_and_mtu_on_either_side(side):
    parser = argparse.ArgumentParser()
    options.configure(parser)
    args = parser.parse_args(["--cm", "--sl", "3", "--tclass", "104", "--mtu", "1024", *side])
    options.settle(args)
    assert path_spec(args) == PathSpec(3, 104, 3, 0)  # 1024 bytes: IBV_MTU_1024


# -- the path over rdma_cm: rdma_init_qp_attr's RTR attributes, then the operator's ------------


def rtr_attr(pv, sl: int, tclass: int, mtu: int, is_global: bool = True):
    """RTR attributes as rdma_init_qp_attr fills them (a real pyverbs QPAttr: its ah_attr is a
    copy, which must be set back)."""
    a = pv.addr
    attr = pv.qp.QPAttr()
    if is_global:
        gr = a.GlobalRoute(dgid=a.GID("0000:0000:0000:0000:0000:ffff:c0a8:4d01"), sgid_index=1)
        gr.traffic_class = tclass
        attr.ah_attr = a.AHAttr(gr=gr, is_global=1, port_num=1, sl=sl)
    else:
        attr.ah_attr = a.AHAttr(dlid=7, is_global=0, port_num=1, sl=sl)
    attr.path_mtu = mtu
    return attr


@pytest.fixture
def real_pyverbs():
    pytest.importorskip("pyverbs.qp", reason="python3-pyverbs (the distribution's) is needed")
    from ibtool.sources.verbs import pyverbs

    return pyverbs()


def test_nothing_asked_keeps_rdma_cms_path_and_says_it(real_pyverbs):
    attr = rtr_attr(real_pyverbs, sl=2, tclass=32, mtu=5)
    used = cm.choose_path(attr, PathSpec(), pkey_index=0)
    assert used == PathSpec(2, 32, 5, 0)
    assert (attr.ah_attr.sl, attr.ah_attr.traffic_class, attr.path_mtu) == (2, 32, 5)


def test_the_operators_sl_tclass_and_smaller_mtu_reach_the_qps_attributes(real_pyverbs):
    attr = rtr_attr(real_pyverbs, sl=0, tclass=0, mtu=5)
    used = cm.choose_path(attr, PathSpec(sl=3, traffic_class=104, mtu=3), pkey_index=1)
    assert used == PathSpec(3, 104, 3, 1)
    ah = attr.ah_attr
    assert (ah.sl, ah.traffic_class, attr.path_mtu) == (3, 104, 3)
    assert str(ah.dgid).endswith("ffff:c0a8:4d01") and ah.sgid_index == 1  # the rest stays


def test_an_mtu_cap_above_the_paths_leaves_the_path_mtu(real_pyverbs):
    attr = rtr_attr(real_pyverbs, sl=0, tclass=0, mtu=3)
    assert cm.choose_path(attr, PathSpec(mtu=5), pkey_index=0).mtu == 3


def test_an_infiniband_path_without_a_grh_has_no_traffic_class(real_pyverbs):
    attr = rtr_attr(real_pyverbs, sl=1, tclass=0, mtu=4, is_global=False)
    used = cm.choose_path(attr, PathSpec(sl=5, traffic_class=104), pkey_index=0)
    assert used == PathSpec(5, 0, 4, 0)
    assert not attr.ah_attr.is_global


class QueriedId:
    """A CMID whose QP query answers with `attr` (or fails); `asked` keeps the masks."""

    def __init__(self, attr, error: Exception | None = None):
        self.attr, self.error, self.asked = attr, error, []

    def query_qp(self, mask):
        self.asked.append(mask)
        if self.error:
            raise self.error
        return self.attr, None


def connection_of(pv, cmid) -> cm.Connection:
    conn = object.__new__(cm.Connection)  # the path read back needs only the id and pyverbs
    conn.pv, conn.cmid = pv, cmid
    return conn


def test_the_path_of_an_ids_own_qp_is_read_back_from_it(real_pyverbs):
    cmid = QueriedId(rtr_attr(real_pyverbs, sl=0, tclass=104, mtu=3))
    assert connection_of(real_pyverbs, cmid).path_used() == PathSpec(0, 104, 3, 0)
    assert cmid.asked == [cm.IBV_QP_AV | cm.IBV_QP_PATH_MTU]
    cmid = QueriedId(rtr_attr(real_pyverbs, sl=4, tclass=0, mtu=4, is_global=False))
    assert connection_of(real_pyverbs, cmid).path_used() == PathSpec(4, 0, 4, 0)


def test_a_path_that_cannot_be_read_back_is_none(real_pyverbs):
    failing = QueriedId(None, real_pyverbs.Error("Failed to query QP. Errno: 22"))
    assert connection_of(real_pyverbs, failing).path_used() is None
    assert connection_of(real_pyverbs, object()).path_used() is None  # no CMID.query_qp


@pytest.mark.parametrize(
    "path, mtu, text",
    [
        (PathSpec(3, 104, 3), None, "mtu 1024, sl 3, tclass 104 (DSCP 26)"),
        (PathSpec(0, 0, 5), 2048, "mtu 2048, sl 0, tclass 0"),
    ],
)
def test_a_path_is_said_as_the_first_line_of_a_ping_says_it(path, mtu, text):
    assert path.describe(mtu) == text
