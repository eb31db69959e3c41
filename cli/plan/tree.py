"""``spotctl plan`` as a person reads it: a tree in ``pulumi preview``'s layout (type, name, the
few inputs that matter), integers as integers, every line within the terminal's width, and values
the mocks made up (ids, addresses) marked as such. ``--json`` keeps the full wire form."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from cli.plan.mocks import Plan, Resource
from infra.basics import counted

MOCKED = " (mocked)"


def short_type(token: str) -> str:
    """``gcp:compute/instance:Instance`` -> ``gcp:compute:Instance``, as the Pulumi CLI shows types."""
    parts = token.split(":")
    if len(parts) == 3 and "/" in parts[1]:
        return f"{parts[0]}:{parts[1].split('/')[0]}:{parts[2]}"
    return token


def number(value: Any) -> str:
    """Pulumi's wire form has only floats: 200.0 is the integer 200."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _get(inputs: dict[str, Any], path: str) -> Any:
    value: Any = inputs
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if isinstance(value, list) and part.startswith("["):
            index = int(part[1:-1])
            value = value[index] if index < len(value) else None
        elif isinstance(value, dict):
            value = value.get(part)
        else:
            return None
    return value


def _tags(inputs: dict[str, Any]) -> dict[str, Any]:
    tags = inputs.get("tags") or inputs.get("labels") or {}
    return tags if isinstance(tags, dict) else {}


def _attempt(r: Resource) -> str | None:
    found = _tags(r.inputs).get("spotctl:attempt") or _tags(r.inputs).get("spotctl-attempt")
    if found is None:
        m = re.search(r"-a(\d+)-n\d+$", str(r.inputs.get("name", "")))
        found = m[1] if m else None
    return f"attempt {found}" if found is not None else None


def _gpu(r: Resource) -> str | None:
    acc = _get(r.inputs, "guestAccelerators[0]")
    if isinstance(acc, dict) and acc.get("type"):
        return f"{acc['type']} x{number(acc.get('count', 1))}"
    return None


def _vm(r: Resource) -> list[str | None]:
    model = _get(r.inputs, "scheduling.provisioningModel")
    market = _get(r.inputs, "instanceMarketOptions.marketType")
    capacity = "spot" if model == "SPOT" or market == "spot" else "on-demand"
    boot = _get(r.inputs, "bootDisk.initializeParams.size") or _get(r.inputs, "rootBlockDevice.volumeSize")
    return [r.inputs.get("machineType") or r.inputs.get("instanceType"), _gpu(r),
            r.inputs.get("zone") or r.inputs.get("availabilityZone"), capacity, _attempt(r),
            f"boot {number(boot)} GB" if boot else None]


def _disk(r: Resource) -> list[str | None]:
    size = r.inputs.get("size")
    return [f"{number(size)} GB" if size is not None else None, r.inputs.get("type"),
            r.inputs.get("zone") or r.inputs.get("availabilityZone"),
            "encrypted" if r.inputs.get("encrypted") is True else None]


def _group(r: Resource) -> list[str | None]:
    lo = r.inputs.get("minSize", _get(r.inputs, "autoscalingPolicy.minReplicas"))
    hi = r.inputs.get("maxSize", _get(r.inputs, "autoscalingPolicy.maxReplicas"))
    target = r.inputs.get("targetSize")
    od = _get(r.inputs, "mixedInstancesPolicy.instancesDistribution.onDemandBaseCapacity")
    return [r.inputs.get("name"), f"{number(lo)}..{_vms(hi)}" if lo is not None and hi is not None else None,
            _vms(target) if target is not None else None,
            f"{number(od)} on-demand" if od is not None else None, r.inputs.get("region")]


def _template(r: Resource) -> list[str | None]:
    model = _get(r.inputs, "scheduling.provisioningModel")
    return [r.inputs.get("machineType"), _gpu(r), {"SPOT": "spot", "STANDARD": "on-demand"}.get(model or "")]


def _secret(r: Resource) -> list[str | None]:
    """A job's secret env store: where, and the value as ``[secret]`` (the plan never holds it)."""
    value = r.inputs.get("value", r.inputs.get("secretData"))
    return [r.inputs.get("name") or r.inputs.get("secretId"), r.inputs.get("type"), r.inputs.get("tier"),
            f"value {value}" if value is not None else None]


def _secret_reader(r: Resource) -> list[str | None]:
    return [r.inputs.get("role"), r.inputs.get("member")]


SUMMARIES: list[tuple[str, Callable[[Resource], list[str | None]]]] = [
    (":Instance", _vm), (":Disk", _disk), (":Volume", _disk), (":Group", _group), ("Autoscaler", _group),
    ("InstanceGroupManager", _group), (":InstanceTemplate", _template),
    ("ssm/parameter:Parameter", _secret), ("secretmanager/secretVersion:", _secret), ("secretmanager/secret:", _secret),
    ("secretmanager/secretIamMember:", _secret_reader),
]


def summary(r: Resource) -> list[str]:
    """The few inputs of ``r`` that matter, as words."""
    for suffix, fn in SUMMARIES:
        if r.type.endswith(suffix) or suffix in r.type:
            words = fn(r)
            break
    else:
        words = [r.inputs.get("name") or r.inputs.get("accountId") or r.inputs.get("bucketPrefix")]
    out = [number(w) for w in words if w not in (None, "")]
    return out + (["protected"] if r.protect else [])


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def _fit(head: str, info: str, width: int, indent: str, sep: str = "  ", words: list[str] | None = None) -> list[str]:
    """``head`` then ``info`` on the same line if it fits, else ``info``'s ``words`` (its parts between
    two spaces) wrapped on lines of its own that start with ``indent`` (the tree's continuation). A
    value is never cut: a word too long after ``indent`` starts further left, and one longer than a
    whole line continues on the next."""
    if not info:
        return [_clip(head, width)]
    if len(head) + len(sep) + len(info) <= width:
        return [f"{head}{sep}{info}"]
    lines, line = [_clip(head, width)], indent
    for word in info.split("  ") if words is None else words:
        if len(line) + len(word) + 2 > width and line.strip(" │"):
            lines.append(line.rstrip())
            line = indent
        if len(line) + len(word) > width:  # (alone on its line, and still too long there)
            lines.append(line.rstrip()) if line.strip(" │") else None
            start = max(0, width - len(word))
            pieces = [word[i:i + width] for i in range(0, len(word), width)] if start == 0 else [word]
            lines += [(" " * start if start else "") + p for p in pieces[:-1]]
            line = " " * start + pieces[-1] + "  "
            continue
        line += word + "  "
    lines.append(line.rstrip())
    return lines


def _vms(n: Any) -> str:
    return f"{number(n)} VM" + ("" if number(n) == "1" else "s")


def render(plan: Plan, width: int = 100) -> str:
    """The plan as ``pulumi preview`` shows an update: one line per resource in a tree."""
    children: dict[str | None, list[Resource]] = {}
    for r in plan.resources:
        children.setdefault(r.parent, []).append(r)
    rows: list[tuple[str, str, str, str]] = []

    def walk(parent: str | None, prefix: str) -> None:
        kids = sorted(children.get(parent, []), key=lambda r: (r.custom, r.name))
        for i, r in enumerate(kids):
            last = i == len(kids) - 1
            below = prefix + ("   " if last else "│  ")
            more = "│  " if children.get(r.urn) else "   "
            rows.append((f"{prefix}{'└─ ' if last else '├─ '}{short_type(r.type)}", r.name, "  ".join(summary(r)), below + more + "  "))
            walk(r.urn, below)

    walk(None, "")
    type_w = max(len(t) for t, _, _, _ in rows)
    name_w = max(len(n) for _, n, _, _ in rows)
    aligned = type_w + 2 + name_w <= width  # else: name right after the type, or on a line of its own
    head = f"stack {plan.stack}: {counted(len(plan.resources), 'resource')} ({counted(sum(r.custom for r in plan.resources), 'cloud resource')}), under mocks"
    header = f"{'Type':<{type_w}}  {'Name':<{name_w}}  Info" if aligned else "Type  Name  Info"
    if len(header) > width:  # (the info words follow each name, wrapped below it: their header can go)
        header = f"{'Type':<{type_w}}  Name"
    lines = [_clip(head, width), "", header]
    for typ, name, info, cont in rows:
        if aligned:
            lines += _fit(f"{typ:<{type_w}}  {name:<{name_w}}".rstrip(), info, width, cont[: width // 2])
        elif len(typ) + 2 + len(name) <= width:
            lines += _fit(f"{typ}  {name}", info, width, cont[: width // 2])
        else:
            lines += _fit(typ, "  ".join(w for w in (name, info) if w), width, cont[: width // 2])
    if plan.outputs:
        lines += ["", "Outputs:"]
        lines += _outputs(plan.outputs, plan, "    ", width)
    return "\n".join(lines) + "\n"


def _outputs(value: Any, plan: Plan, indent: str, width: int) -> list[str]:
    out = []
    for key, v in sorted(value.items()):
        if isinstance(v, dict) and v:
            out.append(f"{indent}{key}:")
            out += _outputs(v, plan, indent + "    ", width)
        else:
            text = "-" if v in (None, [], {}) else ", ".join(number(x) for x in v) if isinstance(v, list) else number(v)
            mocked = MOCKED if any(m and m in text for m in plan.mocked) else ""
            # (wrapped between list items and before "(mocked)", never inside a name)
            items = [f"{number(x)}," for x in v[:-1]] + [number(v[-1])] if isinstance(v, list) and v else [text]
            out += _fit(f"{indent}{key}:", text + mocked, width, indent + "    ", sep=" ",
                        words=items + ([MOCKED.strip()] if mocked else []))
    return out
