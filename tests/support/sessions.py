"""Recorded session messages shared by test modules (tests/test_cli_hexview.py, test_ksy.py)."""

from __future__ import annotations

EXTENSION_METADATA = b"\x10\x20\x30"


def session_stream() -> bytes:
    """A recorded session, made by the project's own encoders (``hurray_schema.net.messages``):
    CLIENT_HELLO with a plain and an extension layout entry, TENSOR_REQUEST, ERROR UNKNOWN_TENSOR,
    PING then a PONG echoing three bytes, ERROR with one of our private codes, a SERVER_HELLO
    without its memory class list, TENSOR_PUT_ACK."""
    from hurray_schema.net import messages as m
    from hurray_schema.structs.session import HELLO_WITHOUT_CLASSES
    from hurray_schema.structs.stream import MessageType as T

    hello = m.Hello(1, 1 << 20, 0b11, layouts=(m.LayoutEntry(0x01), m.LayoutEntry(0xF3, EXTENSION_METADATA)),
                    devices=(0, 1), memory_classes=(0,))
    request = m.Request("weights/layer0", layouts=(m.LayoutEntry(0xF0, b""), m.LayoutEntry(0x03)), device=0,
                        min_alignment=64, flags=0b01)
    short_hello = HELLO_WITHOUT_CLASSES.build({"protocol_version": 1, "max_message_size": 4096,
                                               "capability_flags": 0, "supported_layouts": [],
                                               "supported_devices": [0]})
    return b"".join([
        m.message(T.CLIENT_HELLO, 1, m.encode_hello(hello, server=False)),
        m.message(T.TENSOR_REQUEST, 3, m.encode_request(request)),
        m.message(T.ERROR, 3, m.encode_error(0x02, "no tensor 'weights/layer0'")),
        m.message(T.PING, 5),
        m.message(T.PONG, 5, b"abc"),
        m.message(T.ERROR, 7, m.encode_error(0xF1, "refused")),
        m.message(T.SERVER_HELLO, 1, short_hello),
        m.message(T.TENSOR_PUT_ACK, 9),
    ])
