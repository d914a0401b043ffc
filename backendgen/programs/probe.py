"""What `backendgen check` needs from torch, found in one process (check.py starts it first).

argv[1] is JSON: {"package", "py_apis", "schemas", "ops", "keys", "device_module"}. One JSON
object per line on stdout, each as soon as it is known: {"py_apis": {path: present}}, {"schemas":
{op: {"recorded" or "recorded_error", "live"}}}, then {"load": ...}: importing the backend's
package either failed ({"ok": false, "type", "message"}) or registered its kernels ({"ok": true,
"dangling", "registered", "kernels", "keyed", "backend_name"}), then {"device_module": {name:
present}}: which of the attributes torch reads (dotted names) torch.<device> has. A library that
aborts the process on load leaves the first two lines, and its stderr, to say so.
"""

import json
import sys


def emit(key: str, value) -> None:
    print(json.dumps({key: value}), flush=True)


def py_apis(torch, paths: list[str]) -> dict[str, bool]:
    apis = {}
    for path in paths:
        obj, ok = torch, True
        for part in path.split(".")[1:]:
            if not hasattr(obj, part):
                ok = False
                break
            obj = getattr(obj, part)
        apis[path] = ok
    return apis


def schemas(torch, recorded_schemas: dict[str, str]) -> dict[str, dict]:
    out = {}
    for op, recorded in recorded_schemas.items():
        base, _, overload = op.removeprefix("aten::").partition(".")
        entry = {}
        try:
            entry["recorded"] = str(torch._C.parse_schema(recorded))
        except Exception as e:  # noqa: BLE001 - the message is the finding
            entry["recorded_error"] = str(e)
        try:
            packet = getattr(torch.ops.aten, base)
            entry["live"] = str(getattr(packet, overload or "default")._schema)
        except (AttributeError, RuntimeError):
            entry["live"] = None
        out[op] = entry
    return out


def loaded(torch, ops: list[str], keys: dict[str, list[str]]) -> dict:
    """What the backend, imported, registered."""
    dangling = [d for d in torch._C._dispatch_find_dangling_impls() if "PrivateUse1" in d]
    registered = sorted(torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1"))
    kernels = {}
    for op in ops:
        try:
            has = torch._C._dispatch_has_kernel_for_dispatch_key(op, "PrivateUse1")
            table = torch._C._dispatch_dump_table(op)
            line = next((ln for ln in table.splitlines() if ln.startswith("PrivateUse1")), "")
        except RuntimeError:
            has, line = False, ""
        kernels[op] = {"has": has, "line": line}
    keyed = {}
    for op, op_keys in keys.items():
        keyed[op] = {}
        for key in op_keys:
            try:
                keyed[op][key] = torch._C._dispatch_has_kernel_for_dispatch_key(op, key)
            except RuntimeError:
                keyed[op][key] = False
    return {
        "ok": True,
        "dangling": dangling,
        "registered": registered,
        "kernels": kernels,
        "keyed": keyed,
        "backend_name": torch._C._get_privateuse1_backend_name(),
    }


def device_module(torch, names: list[str]) -> dict[str, bool]:
    mod = getattr(torch, torch._C._get_privateuse1_backend_name(), None)
    out = {}
    for name in names:
        obj, ok = mod, mod is not None
        for part in name.split("."):
            try:
                obj = getattr(obj, part)
            except Exception:  # noqa: BLE001 - a module __getattr__ may raise anything; absent is the finding
                ok = False
                break
        out[name] = ok
    return out


def main() -> None:
    req = json.loads(sys.argv[1])
    import torch

    emit("py_apis", py_apis(torch, req["py_apis"]))
    emit("schemas", schemas(torch, req["schemas"]))
    try:
        __import__(req["package"])
    except BaseException as e:  # noqa: BLE001 - whatever importing the backend raises is the finding
        emit("load", {"ok": False, "type": type(e).__name__, "message": str(e)[:2000]})
        return
    emit("load", loaded(torch, req["ops"], req.get("keys", {})))
    emit("device_module", device_module(torch, req.get("device_module", [])))


if __name__ == "__main__":
    main()
