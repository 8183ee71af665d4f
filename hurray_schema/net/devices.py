"""Device negotiation (``interchange.md § Server Device Selection``).

This server places every buffer in host memory.  It may still advertise other devices
(``devices=("cpu", "cuda")``): such a device is then always *transiently unavailable*, which is
what rule 4 is about, so a request for it falls back to CPU when the client advertised CPU, and
is refused otherwise.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from ..errors import HurraySchemaError
from ..rules import session as rules
from ..structs.tags import DeviceTag

__all__ = ["DeviceRefused", "parse_devices", "select_device", "check_placement", "AVAILABLE"]

AVAILABLE = (DeviceTag.CPU,)
"""Where this implementation can place a buffer."""


class DeviceRefused(HurraySchemaError):
    """The request's device cannot be served: the server answers DEVICE_UNAVAILABLE."""


def parse_devices(devices: Iterable) -> tuple[int, ...]:
    """Device tags from names (``"cpu"``, ``"cuda"``, case-insensitive) or numbers."""
    out = []
    for d in devices:
        if isinstance(d, str):
            try:
                out.append(int(DeviceTag[d.upper()]))
            except KeyError:
                raise HurraySchemaError(
                    f"unknown device {d!r}; one of {', '.join(t.name.lower() for t in DeviceTag)}") from None
        else:
            out.append(int(d))
    if not out:
        raise HurraySchemaError("at least one device is needed")
    return tuple(dict.fromkeys(out))


def select_device(preferred: int, client_devices: Sequence[int], server_devices: Sequence[int]) -> int:
    """The placement for a request preferring ``preferred`` (rules 1-4), or
    :class:`DeviceRefused` (DEVICE_UNAVAILABLE, rules 2 and 3)."""
    if preferred in server_devices and preferred in AVAILABLE:
        return preferred  # rule 1
    if preferred == DeviceTag.CPU:
        raise DeviceRefused("this server cannot place the tensor in CPU memory (rule 2)")
    if preferred in server_devices and DeviceTag.CPU in client_devices:
        return int(DeviceTag.CPU)  # rule 4: advertised, unavailable now, and the client takes CPU
    name = _name(preferred)
    if preferred in server_devices:
        raise DeviceRefused(f"{name} is unavailable and the client did not advertise CPU (rules 3 and 4)")
    raise DeviceRefused(f"this server does not serve {name} (rule 3)")


def check_placement(placed: int, preferred: int, client_devices: Sequence[int], server_devices: Sequence[int],
                    at: int) -> None:
    """What the client can see of the server's choice: the buffers' ``device_tag`` is the
    preferred device, or CPU for a device the server advertised when the client advertised CPU
    (``session.device.selection``); a placement the client did not advertise it refuses
    (``session.device.accept``, rule 6)."""
    if placed == preferred:
        return
    if placed not in client_devices:
        raise rules.DEVICE_ACCEPT.violation(f"the response is on {_name(placed)}, which the client did not "
                                            "advertise", at)
    if not (placed == DeviceTag.CPU and preferred in server_devices):
        raise rules.DEVICE_SELECTION.violation(
            f"the response is on {_name(placed)}, the request preferred {_name(preferred)}", at)


def _name(tag: int) -> str:
    try:
        return DeviceTag(tag).name
    except ValueError:
        return f"device 0x{tag:02X}"
