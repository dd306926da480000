#!/usr/bin/python
"""Test-only module: make this host look like the EL (or other) machine described by a JSON fixture.

Returns the fixture's facts under ``ansible_facts`` with every key prefixed ``ansible_``; Ansible then updates
both ``ansible_facts[...]`` and the injected ``ansible_*`` variables. Keys absent from the fixture keep the
values of the real fact gathering. (``-e ansible_os_family=RedHat`` would not change ``ansible_facts``.)
``overrides`` replaces some of the fixture's facts for one host or run (e.g. its hostname, or the kernel it runs).
"""

from __future__ import annotations

import json

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(argument_spec={"path": {"type": "path", "required": True}, "overrides": {"type": "dict", "default": {}}},
                           supports_check_mode=True)
    with open(module.params["path"], encoding="utf-8") as handle:
        facts = {**json.load(handle)["facts"], **module.params["overrides"]}
    module.exit_json(changed=False, ansible_facts={"ansible_" + key: value for key, value in facts.items()})


if __name__ == "__main__":
    main()
