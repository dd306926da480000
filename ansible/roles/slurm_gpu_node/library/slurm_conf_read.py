#!/usr/bin/python
"""Read a slurm.conf the way Slurm reads it: with every file its Include lines name, recursively and in order.

Slurm reads an included file inline where its Include line stands (slurm.conf(5), INCLUDE MODIFIERS): a relative
name is looked up in slurm.conf's directory, %c is the ClusterName set before the line, and a pattern with wildcards
names every file it matches (sorted). A key set twice keeps the later value ("latest value used", parse_config.c),
and a NodeName defined twice is ignored up to Slurm 23.11 and fatal to slurmctld from 24.05 (read_config.c): so a
role that looks only at the main file misses what a site keeps in its included files.

Read-only. `root` is the host's root as this run sees it (an image or a test root; "" on a live host): the paths
in slurm.conf are the host's, the files are read under `root`. It runs on the node's own Python, EL7's 2.7 and
EL8's 3.6 included (tests/ansible/test_target_python.py).
"""

from __future__ import absolute_import, division, print_function

import glob
import os
import re

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: slurm_conf_read
short_description: Read slurm.conf and the files its Include lines name, in Slurm's order (read-only)
options:
  path:
    description: slurm.conf as the host names it (e.g. /etc/slurm/slurm.conf).
    type: str
    required: true
  root:
    description: The host's root as this run sees it; "" on a live host.
    type: str
    default: ""
  skip:
    description: Names (basenames) of included files not to read, e.g. the file these roles write themselves.
    type: list
    elements: str
    default: []
"""

RETURN = r"""
exists: {description: Whether slurm.conf itself exists., type: bool, returned: always}
files: {description: "Every file read, in Slurm's order: [{path (the host's path), content}]; slurm.conf first.", type: list, returned: always}
text: {description: "slurm.conf with each Include line followed by the file it names (skip excepted): what Slurm parses.", type: str, returned: always}
keys: {description: "{key in lower case: host path of the file whose line sets it last} for single-valued keys: where Slurm takes its value from.", type: dict, returned: always}
missing: {description: The included files (host paths or patterns) that do not exist; Slurm refuses such a slurm.conf., type: list, returned: always}
"""

INCLUDE = re.compile(r"^\s*include\s+(\S+)\s*(?:#.*)?$", re.I)
CLUSTER_NAME = re.compile(r"^\s*clustername\s*=\s*(\S+)", re.I)
KEY = re.compile(r"^\s*([A-Za-z_]+)\s*=")
# Lines that define records (several at once), not single-valued keys (as the slurm_conf filters).
RECORD_KEYS = ("nodename", "partitionname", "nodeset", "downnodes", "frontendname", "switchname")
# Slurm stops at a loop of includes long before this; the bound keeps a bad file from recursing forever here.
MAX_DEPTH = 10


def read_text(path):
    handle = open(path, "rb")
    try:
        return handle.read().decode("utf-8", "replace")
    finally:
        handle.close()


class Reader(object):
    def __init__(self, root, conf_dir, skip):
        self.root, self.conf_dir, self.skip = root.rstrip("/"), conf_dir, set(skip)
        self.files, self.missing, self.keys, self.cluster = [], [], {}, ""

    def host_paths(self, name):
        """The host paths an Include names: relative to slurm.conf's directory, %c expanded, wildcards matched."""
        name = name.replace("%c", self.cluster)
        if not name.startswith("/"):
            name = os.path.join(self.conf_dir, name)
        if not glob.has_magic(name):
            return [name] if os.path.isfile(self.root + name) else []
        return sorted(found[len(self.root):] for found in glob.glob(self.root + name) if os.path.isfile(found))

    def expand(self, host_path, depth):
        """The text of one file with its includes expanded inline; records each file read."""
        text = read_text(self.root + host_path)
        self.files.append({"path": host_path, "content": text})
        out = []
        for line in text.splitlines():
            bare = line.split("#", 1)[0]
            cluster = CLUSTER_NAME.match(bare)
            if cluster:
                self.cluster = cluster.group(1)
            key = KEY.match(bare)
            if key and key.group(1).lower() not in RECORD_KEYS:
                self.keys[key.group(1).lower()] = host_path
            out.append(line)
            include = INCLUDE.match(line)
            if not include or depth >= MAX_DEPTH or os.path.basename(include.group(1)) in self.skip:
                continue
            paths = self.host_paths(include.group(1))
            if not paths:
                self.missing.append(include.group(1))
            for path in paths:
                out.append(self.expand(path, depth + 1))
        return "\n".join(out)


def main():
    module = AnsibleModule(argument_spec={"path": {"type": "str", "required": True}, "root": {"type": "str", "default": ""},
                                          "skip": {"type": "list", "elements": "str", "default": []}},
                           supports_check_mode=True)
    path, root = module.params["path"], module.params["root"]
    reader = Reader(root, os.path.dirname(path), module.params["skip"])
    if not os.path.isfile(root.rstrip("/") + path):
        module.exit_json(changed=False, exists=False, files=[], text="", missing=[], keys={})
    try:
        text = reader.expand(path, 0)
    except (IOError, OSError) as error:
        module.fail_json(msg="slurm_conf_read: cannot read %s: %s" % (path, error))
    module.exit_json(changed=False, exists=True, files=reader.files, text=text, missing=reader.missing, keys=reader.keys)


if __name__ == "__main__":
    main()
