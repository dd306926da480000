"""Filters that read slurm.conf the way Slurm does, so the tasks ask questions instead of writing regexes:

  text | slurm_conf_values          {key (lower case): value} of the single-valued keys, the last one winning
  text | slurm_conf_includes        the files named by Include lines, in order
  values | slurm_memlock_propagated  whether jobs inherit the submitting shell's MEMLOCK limit
  values | slurm_gres_types          the GresTypes list
  values | slurm_memlock_keys        the propagation keys to set so MEMLOCK is not propagated, the site's choice kept
  text | slurm_conf_nodenames        the NodeNames the NodeName lines of a slurm.conf define (ranges expanded)
  text | slurm_conf_problems(...)    what in the configuration a host reads keeps GPU jobs from working there
  text | slurm_gres_site_lines(node)  a node's gres.conf split into the site's lines to keep and the GPU lines ours replace
  text | slurm_gres_file(node, block)  the node's new gres.conf: the site's lines kept, then our marked block

Slurm's keys are case-insensitive; `#` starts a comment. Lines that define several things at once (NodeName=...,
PartitionName=..., NodeSet=..., DownNodes=..., FrontendName=...) are not single-valued keys and are left out.
"""

from __future__ import annotations

import re

RECORD_KEYS = {"nodename", "partitionname", "nodeset", "downnodes", "frontendname", "switchname"}


def slurm_conf_values(text: str) -> dict:
    values = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        match = re.match(r"([A-Za-z_]+)\s*=\s*(.*)$", line)
        if match and match.group(1).lower() not in RECORD_KEYS:
            values[match.group(1).lower()] = match.group(2).strip()
    return values


def slurm_conf_includes(text: str) -> list:
    return [m.group(1) for m in re.finditer(r"(?im)^\s*include\s+(\S+)\s*(?:#.*)?$", text)]


def _names(value: str) -> set:
    return {name.strip().upper() for name in value.split(",") if name.strip()}


def slurm_memlock_propagated(values: dict) -> bool:
    """PropagateResourceLimitsExcept wins when set (MEMLOCK or ALL in it keeps MEMLOCK home); otherwise
    PropagateResourceLimits (default ALL) propagates MEMLOCK when it names ALL or MEMLOCK (NONE: nothing)."""
    if values.get("propagateresourcelimitsexcept"):
        return not _names(values["propagateresourcelimitsexcept"]) & {"MEMLOCK", "ALL"}
    return bool(_names(values.get("propagateresourcelimits") or "ALL") & {"ALL", "MEMLOCK"})


def slurm_memlock_keys(values: dict) -> dict:
    """{key: value} to set so that jobs do not inherit the submitting shell's MEMLOCK, keeping what the site chose for
    the other limits: an allow-list (PropagateResourceLimits=MEMLOCK,STACK) loses MEMLOCK (NONE when nothing is
    left); otherwise PropagateResourceLimitsExcept gains it. A value of None means the key is to be removed."""
    if not slurm_memlock_propagated(values):
        return {}
    allowed = _names(values.get("propagateresourcelimits") or "ALL")
    if values.get("propagateresourcelimitsexcept") or "ALL" in allowed:
        except_names = [n.strip() for n in values.get("propagateresourcelimitsexcept", "").split(",") if n.strip()]
        return {"PropagateResourceLimitsExcept": ",".join(except_names + ["MEMLOCK"]), "PropagateResourceLimits": None}
    kept = [n.strip() for n in values["propagateresourcelimits"].split(",") if n.strip() and n.strip().upper() != "MEMLOCK"]
    return {"PropagateResourceLimits": ",".join(kept) or "NONE"}


def _expand_hostlist(expression: str) -> list:
    """Slurm's host list: "gpu[01-03,07],login1" -> gpu01 gpu02 gpu03 gpu07 login1 (one bracket per name)."""
    names = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", expression):
        match = re.fullmatch(r"(.*)\[([^\]]*)\](.*)", part)
        if not match:
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                names.append(f"{prefix}{number:0{width}d}{suffix}")
    return names


def slurm_conf_nodenames(text: str) -> list:
    """The NodeNames defined by the NodeName= lines of `text` (NodeName=DEFAULT sets defaults, defines none)."""
    found = []
    for line in text.splitlines():
        match = re.match(r"\s*NodeName\s*=\s*(\S+)", line.split("#", 1)[0], re.I)
        if match and match.group(1).upper() != "DEFAULT":
            found += _expand_hostlist(match.group(1))
    return found


def slurm_gres_types(values: dict) -> list:
    return [name.strip() for name in values.get("grestypes", "").split(",") if name.strip()]


def slurm_conf_problems(text: str, nodes_text: str, gres_text: str, nodes_file: str, node_name: str = "",
                        configless: bool = False) -> list:
    """The problems of the slurm.conf `text` that a host reads, with the NodeName file `nodes_file` (its text
    `nodes_text`, '' when missing) and gres.conf (`gres_text`); `node_name` is set on GPU nodes (their own lines must
    be there: configless gres.conf lines are NodeName-qualified)."""
    values = slurm_conf_values(text)
    problems = []
    if "gpu" not in slurm_gres_types(values):
        problems.append(f'GresTypes is "{values.get("grestypes", "")}", without gpu: slurmd registers no GPU and jobs '
                        "cannot ask for one")
    if slurm_memlock_propagated(values):
        problems.append("it propagates the submitting shell's MEMLOCK limit (PropagateResourceLimits="
                        f"{values.get('propagateresourcelimits', 'ALL')}, PropagateResourceLimitsExcept="
                        f"{values.get('propagateresourcelimitsexcept', '(unset)')}), so jobs submitted here run with the login "
                        "shell's locked-memory limit and NCCL over InfiniBand fails to register memory: set "
                        "PropagateResourceLimitsExcept=MEMLOCK")
    included = [path.rsplit("/", 1)[-1] for path in slurm_conf_includes(text)]
    if nodes_file not in included or not nodes_text:
        problems.append(f"it does not include {nodes_file} (the GPU nodes' NodeName lines)")
    if node_name and node_name in slurm_conf_nodenames(text):
        problems.append(f"slurm.conf itself defines NodeName={node_name}, and Slurm ignores a later line for the same node, so "
                        f"the line of {nodes_file} (its GPUs) is not used: remove {node_name} from slurm.conf's NodeName lines")
    if node_name:
        name = re.escape(node_name)
        if nodes_text and not re.search(rf"(?m)^\s*NodeName={name}\s", nodes_text):
            problems.append(f"the NodeName lines do not name {node_name}")
        gres_lines = rf"(?m)^\s*NodeName={name}\s" if configless else r"(?m)^\s*(Name=|AutoDetect=)"
        if not re.search(gres_lines, gres_text):
            problems.append(f"its gres.conf has no GPU lines for {node_name}")
    return problems


GRES_BLOCK_BEGIN = "# BEGIN hpc-train GPUs of this node"
GRES_BLOCK_END = "# END hpc-train GPUs of this node"
# What the roles wrote before they kept a block (the whole file was theirs): its header lines.
_OLD_GRES_HEADER = re.compile(r"#\s*(Ansible managed|GPUs of this node for Slurm;.*)$")


def _gres_fields(line: str) -> dict:
    return {key.lower(): value for key, value in re.findall(r"([A-Za-z]+)=(\S+)", line.split("#", 1)[0])}


def slurm_gres_site_lines(text: str, node_name: str) -> dict:
    """Split a node's gres.conf into {"kept": the site's lines, "replaced": the GPU lines for `node_name` outside our
    block}. Ours (the marked block, and the header of the whole file the roles wrote before) goes; so does every line
    that describes this node's GPUs (Name=gpu, or an AutoDetect line with no Name) with no NodeName or one naming this
    node: slurmd would count those GPUs twice or mix their AutoDetect with ours. Everything else stays: other GRES
    (bandwidth, MPS, shards), lines for other nodes (slurmd skips them), comments."""
    kept, replaced, in_block = [], [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == GRES_BLOCK_BEGIN:
            in_block = True
        elif stripped == GRES_BLOCK_END:
            in_block = False
        elif in_block or _OLD_GRES_HEADER.fullmatch(stripped):
            continue
        else:
            fields = _gres_fields(line)
            for_us = "nodename" not in fields or node_name in _expand_hostlist(fields["nodename"])
            gpu = fields.get("name", "").lower() == "gpu" or ("autodetect" in fields and "name" not in fields)
            (replaced if for_us and gpu else kept).append(line)
    while kept and not kept[-1].strip():
        kept.pop()
    return {"kept": kept, "replaced": replaced}


def slurm_gres_file(text: str, node_name: str, block: str) -> str:
    """The node's gres.conf with the site's lines of `text` kept, then a blank line and our marked `block`."""
    kept = slurm_gres_site_lines(text, node_name)["kept"]
    return "\n".join([*kept, *([""] if kept else []), GRES_BLOCK_BEGIN, block.strip("\n"), GRES_BLOCK_END]) + "\n"


class FilterModule:
    def filters(self) -> dict:
        return {"slurm_conf_values": slurm_conf_values, "slurm_conf_includes": slurm_conf_includes,
                "slurm_memlock_propagated": slurm_memlock_propagated, "slurm_gres_types": slurm_gres_types,
                "slurm_memlock_keys": slurm_memlock_keys, "slurm_conf_nodenames": slurm_conf_nodenames,
                "slurm_conf_problems": slurm_conf_problems, "slurm_gres_site_lines": slurm_gres_site_lines,
                "slurm_gres_file": slurm_gres_file}
