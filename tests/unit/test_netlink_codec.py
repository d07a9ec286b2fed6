"""The NLDEV attribute table and codec: requests encoded as the kernel parses them, replies
decoded strictly into plain Python values, whatever newer kernels add.

The byte builders here (nla, message, ...) write netlink by hand, independently of pyroute2,
and are shared by the other test_netlink modules.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ibtool.errors import DataError, ExitCode
from ibtool.sources.netlink import attrs as A
from ibtool.sources.netlink import messages
from tests.fixtures.netlink import (
    DEV_INDEX,
    DEV_NAME,
    NODE_GUID,
    PORT_STATE,
    RES_LQPN,
    RES_QP,
    RES_QP_ENTRY,
    RES_USECNT,
    nla,
    reply,
    string,
    u8,
    u32,
    u64,
)

# -- netlink by hand ---------------------------------------------------------------------------


def decode_one(data: bytes) -> dict:
    (msg,) = messages.parse(data)
    return messages.attributes(msg)


# -- the table ---------------------------------------------------------------------------------


def test_the_table_has_every_attribute_0_to_118_once_with_its_uapi_name():
    assert [a.id for a in A.ATTRIBUTES] == list(range(119))
    assert len(A.BY_NAME) == 119
    assert all(a.name.startswith("RDMA_NLDEV_") for a in A.ATTRIBUTES)
    # The three names that break the RDMA_NLDEV_ATTR_ pattern are kept as the uapi has them.
    assert A.BY_ID[66].name == "RDMA_NLDEV_SYS_ATTR_NETNS_MODE"
    assert A.BY_ID[68].name == "RDMA_NLDEV_NET_NS_FD"
    assert A.BY_ID[103].name == "RDMA_NLDEV_SYS_ATTR_MONITOR_MODE"
    assert A.BY_ID[0].kind == A.PAD
    assert A.BY_ID[73].kind == A.U32  # UVERBS_DRIVER_ID: u64 in the header, u32 on the wire


def test_every_table_names_a_nest_as_its_entry():
    tables = [a for a in A.ATTRIBUTES if a.kind == A.TABLE]
    assert {a.name.removeprefix("RDMA_NLDEV_ATTR_") for a in tables} == {
        "RES_SUMMARY",
        "RES_QP",
        "RES_CM_ID",
        "RES_CQ",
        "RES_MR",
        "RES_PD",
        "RES_CTX",
        "RES_SRQ",
        "STAT_COUNTER",
        "STAT_HWCOUNTERS",
        "FRMR_POOLS",
    }
    assert all(A.BY_NAME[a.entry].kind == A.NEST for a in tables)


def test_the_pyroute2_map_is_the_table_with_explicit_ids():
    assert [(i, name) for i, name, *_ in messages.NLA_MAP] == [(a.id, a.name) for a in A.ATTRIBUTES]
    assert messages.nldev_nest.nla_map is messages.nldevmsg.nla_map


def test_commands_and_message_types():
    assert A.COMMANDS[6] == "RDMA_NLDEV_CMD_SYS_GET"
    assert A.nlmsg_type(A.RDMA_NLDEV_CMD_GET) == 5121
    assert A.nlmsg_type(A.RDMA_NLDEV_CMD_PORT_GET) == 5125
    assert A.command_of(5125) == A.RDMA_NLDEV_CMD_PORT_GET
    assert A.command_of(A.NLMSG_DONE) is None
    assert A.command_of((4 << 10) + 1) is None  # the LS client


@pytest.mark.parametrize("command", sorted(A.COMMANDS), ids=lambda c: A.COMMANDS[c])
def test_the_marshal_decodes_every_nldev_command(command):
    assert decode_one(reply(command, u32(DEV_INDEX, 3))) == {"RDMA_NLDEV_ATTR_DEV_INDEX": 3}


# -- encoding ----------------------------------------------------------------------------------


def test_a_request_is_a_bare_nlmsghdr_then_attributes():
    data = messages.encode(
        A.RDMA_NLDEV_CMD_PORT_GET,
        {"RDMA_NLDEV_ATTR_DEV_INDEX": 2, "RDMA_NLDEV_ATTR_PORT_INDEX": 1},
        flags=A.NLM_F_REQUEST | A.NLM_F_ACK,
        seq=77,
    )
    header = struct.pack("=IHHII", 32, 5125, 5, 77, 0)
    assert data == header + u32(1, 2) + u32(3, 1)


def test_nests_are_sent_with_nla_f_nested_as_strict_handlers_demand():
    data = messages.encode(
        A.RDMA_NLDEV_CMD_STAT_SET,
        {"RDMA_NLDEV_ATTR_STAT_HWCOUNTERS": [("RDMA_NLDEV_ATTR_STAT_HWCOUNTER_INDEX", 5)]},
        flags=A.NLM_F_REQUEST | A.NLM_F_ACK,
        seq=1,
    )
    assert data[16:] == nla(80, u32(94, 5), nested=True)


def test_an_unknown_attribute_name_in_a_request_is_a_programming_error():
    with pytest.raises(ValueError, match="RDMA_NLDEV_ATTR_NOPE"):
        messages.encode(1, {"RDMA_NLDEV_ATTR_NOPE": 1}, flags=1, seq=1)


SCALARS = {
    "RDMA_NLDEV_ATTR_LMC": 0,  # u8
    "RDMA_NLDEV_ATTR_PORT_STATE": 255,
    "RDMA_NLDEV_ATTR_DEV_INDEX": 0xFFFFFFFF,  # u32
    "RDMA_NLDEV_ATTR_NODE_GUID": 0xFFFFFFFFFFFFFFFF,  # u64
    "RDMA_NLDEV_ATTR_DRIVER_S32": -(2**31),
    "RDMA_NLDEV_ATTR_DRIVER_S64": -(2**63),
    "RDMA_NLDEV_ATTR_DEV_NAME": "mlx5_0",
    "RDMA_NLDEV_ATTR_RES_KERN_NAME": "ünïcode",
    "RDMA_NLDEV_ATTR_RES_SRC_ADDR": bytes(range(128)),
}


def round_trip(command: int, attributes: dict) -> dict:
    return decode_one(messages.encode(command, attributes, flags=0, seq=1))


def test_every_scalar_kind_round_trips():
    assert round_trip(A.RDMA_NLDEV_CMD_RES_CM_ID_GET, SCALARS) == SCALARS


def test_nests_tables_and_driver_attributes_round_trip():
    attributes = {
        "RDMA_NLDEV_ATTR_DEV_INDEX": 0,
        "RDMA_NLDEV_ATTR_RES_QP": [
            {
                "RDMA_NLDEV_ATTR_RES_LQPN": 17,
                "RDMA_NLDEV_ATTR_RES_STATE": 3,
                "RDMA_NLDEV_ATTR_DRIVER": {"sq_wqe_cnt": 8, "state": "up", "delta": -1},
            },
            {"RDMA_NLDEV_ATTR_RES_LQPN": 18},
        ],
        "RDMA_NLDEV_ATTR_FRMR_POOLS": [
            {"RDMA_NLDEV_ATTR_FRMR_POOL_KEY": {"RDMA_NLDEV_ATTR_FRMR_POOL_KEY_ATS": 1}}
        ],
        "RDMA_NLDEV_ATTR_STAT_HWCOUNTERS": [("RDMA_NLDEV_ATTR_STAT_HWCOUNTER_INDEX", 4)],
        "RDMA_NLDEV_ATTR_RES_SUMMARY": [],
    }
    assert round_trip(A.RDMA_NLDEV_CMD_RES_QP_GET, attributes) == attributes


def _value_strategy(kind: str):
    bits = {A.U8: 8, A.U16: 16, A.U32: 32, A.U64: 64}
    if kind in bits:
        return st.integers(0, 2 ** bits[kind] - 1)
    if kind in (A.S32, A.S64):
        half = 2 ** (31 if kind == A.S32 else 63)
        return st.integers(-half, half - 1)
    if kind == A.STRING:
        return st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"))
    return st.binary(max_size=300)


LEAVES = [a for a in A.ATTRIBUTES if a.kind in (*A.SIZES, A.STRING, A.BINARY)]


@given(
    st.lists(st.sampled_from(LEAVES), unique=True, max_size=12).flatmap(
        lambda chosen: st.fixed_dictionaries({a.name: _value_strategy(a.kind) for a in chosen})
    ),
    st.sampled_from(sorted(A.COMMANDS)),
)
def test_any_set_of_leaf_attributes_round_trips(attributes, command):
    assert round_trip(command, attributes) == attributes


# -- decoding what the kernel may send ---------------------------------------------------------


def test_nests_decode_the_same_with_and_without_nla_f_nested():
    # nla_nest_start() sets the flag, nla_nest_start_noflag() (the RES_* tables) does not.
    entry = u32(RES_LQPN, 9)
    flagged = reply(10, nla(RES_QP, nla(RES_QP_ENTRY, entry, nested=True), nested=True))
    bare = reply(10, nla(RES_QP, nla(RES_QP_ENTRY, entry)))
    expected = {"RDMA_NLDEV_ATTR_RES_QP": [{"RDMA_NLDEV_ATTR_RES_LQPN": 9}]}
    assert decode_one(flagged) == decode_one(bare) == expected


def test_a_pad_attribute_before_a_u64_is_skipped():
    # nla_put_u64_64bit() pads with an attribute of type 0 where u64s must be 8-byte aligned.
    data = reply(12, u32(DEV_INDEX, 1), nla(0), u64(RES_USECNT, 2**40), nla(0, b"\0\0\0\0"))
    assert decode_one(data) == {"RDMA_NLDEV_ATTR_DEV_INDEX": 1, "RDMA_NLDEV_ATTR_RES_USECNT": 2**40}


def test_attributes_unknown_to_the_table_are_ignored_at_every_depth():
    # A newer kernel's attribute 200, at the top and inside an entry.
    data = reply(
        10,
        u32(200, 7),
        string(DEV_NAME, "rxe0"),
        nla(RES_QP, nla(RES_QP_ENTRY, nla(200, b"x" * 13) + u32(RES_LQPN, 1))),
        nla(119, b"\1\2\3\4\5\6\7\x08", nested=True),
    )
    assert decode_one(data) == {
        "RDMA_NLDEV_ATTR_DEV_NAME": "rxe0",
        "RDMA_NLDEV_ATTR_RES_QP": [{"RDMA_NLDEV_ATTR_RES_LQPN": 1}],
    }


def test_a_truncated_attribute_is_a_data_error_naming_it():
    good = u32(DEV_INDEX, 1)
    # NODE_GUID's header says 12 bytes; the message ends 4 bytes into its payload.
    data = reply(1, good, struct.pack("=HH", 12, NODE_GUID) + b"\1\2\3\4")
    with pytest.raises(DataError, match="RDMA_NLDEV_ATTR_NODE_GUID is truncated") as e:
        decode_one(data)
    assert e.value.exit_code == ExitCode.DATA_ERROR
    assert e.value.hint


def test_a_truncated_attribute_inside_a_nest_is_named_by_its_path():
    entry = nla(RES_QP_ENTRY, struct.pack("=HH", 40, RES_LQPN) + b"\1\0\0\0")
    with pytest.raises(DataError) as e:
        decode_one(reply(10, nla(RES_QP, entry)))
    assert (
        "RDMA_NLDEV_ATTR_RES_QP > RDMA_NLDEV_ATTR_RES_QP_ENTRY > RDMA_NLDEV_ATTR_RES_LQPN "
        "is truncated" in e.value.message
    )


def test_an_integer_shorter_than_its_type_is_a_data_error():
    with pytest.raises(DataError, match="RDMA_NLDEV_ATTR_DEV_INDEX has 2 bytes, a u32 needs 4"):
        decode_one(reply(1, nla(DEV_INDEX, b"\1\0")))


def test_a_longer_integer_is_read_as_the_kernel_policy_reads_it():
    assert decode_one(reply(1, nla(PORT_STATE, b"\4\0\0\0"))) == {"RDMA_NLDEV_ATTR_PORT_STATE": 4}


def test_an_unknown_attribute_that_is_truncated_is_a_data_error_too():
    with pytest.raises(DataError, match="attribute 200 is truncated"):
        decode_one(reply(1, struct.pack("=HH", 64, 200) + b"\0" * 4))


def test_a_truncated_message_is_a_data_error():
    data = reply(1, u32(DEV_INDEX, 1)) + reply(1, string(DEV_NAME, "mlx5_0"))
    with pytest.raises(DataError, match="truncated message"):
        messages.parse(data[:-4])


def test_strings_end_at_the_first_nul_and_bad_utf8_is_replaced():
    data = reply(1, nla(DEV_NAME, b"rxe0\0junk\0"), nla(5, b"\xff1\0"))
    assert decode_one(data) == {
        "RDMA_NLDEV_ATTR_DEV_NAME": "rxe0",
        "RDMA_NLDEV_ATTR_FW_VERSION": "\ufffd1",
    }


def test_driver_attributes_are_key_value_pairs_with_an_optional_print_type():
    driver = (
        string(54, "sq_psn")
        + u8(55, 1)  # DRIVER_PRINT_TYPE HEX: a display hint
        + u32(57, 0x10)
        + string(54, "name")
        + string(54, "qp17")
        + string(54, "delta")
        + nla(58, struct.pack("=q", -5))
    )
    assert decode_one(reply(10, nla(52, driver))) == {
        "RDMA_NLDEV_ATTR_DRIVER": {"sq_psn": 16, "name": "qp17", "delta": -5}
    }


def test_a_driver_value_without_its_key_is_a_data_error():
    with pytest.raises(DataError, match="RDMA_NLDEV_ATTR_DRIVER > RDMA_NLDEV_ATTR_DRIVER_U32"):
        decode_one(reply(10, nla(52, u32(57, 1))))
    with pytest.raises(DataError, match="ends with key 'lonely'"):
        decode_one(reply(10, nla(52, string(54, "lonely"))))


def _plain(value) -> bool:
    if isinstance(value, dict):
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return type(value) in (int, str, bytes)


def test_no_pyroute2_object_leaves_the_decoder():
    data = reply(
        10,
        string(DEV_NAME, "rxe0"),
        nla(RES_QP, nla(RES_QP_ENTRY, u32(RES_LQPN, 1) + nla(52, string(54, "k") + u32(57, 2)))),
        nla(80, u32(94, 3), nested=True),
        nla(33, b"\2\0" + b"\0" * 126),
    )
    assert _plain(decode_one(data))
