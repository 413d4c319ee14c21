"""Every profile in deploy/examples is what the command in its comment prints today."""

import json
import re
import shlex

import pytest
import yaml

from carma_profile.__main__ import main
from conftest import REPO

EXAMPLES = REPO / "deploy" / "examples"
COMMAND = re.compile(r"^\s*#\s+(python -m carma_profile .+)$", re.M)


def profiles(doc):
    """The modelProfile of a TrainingTask, the carma.io/model-profile of every pod."""
    if doc.get("kind") == "TrainingTask":
        yield doc["spec"]["modelProfile"]
    elif doc.get("kind") == "Pod":
        ann = doc["metadata"].get("annotations", {})
        if "carma.io/model-profile" in ann:
            yield json.loads(ann["carma.io/model-profile"])
    for item in doc.get("items", []):
        yield from profiles(item)


@pytest.mark.parametrize("path", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_example_profile_is_the_commands_output(path, capsys, monkeypatch):
    text = (EXAMPLES / path).read_text()
    found = [p for doc in yaml.safe_load_all(text) if doc for p in profiles(doc)]
    if not found:
        assert "modelProfile" not in text and "model-profile" not in text
        return
    commands = COMMAND.findall(text)
    assert commands, f"{path} has a profile but no `python -m carma_profile` command in a comment"
    monkeypatch.chdir(REPO)
    printed = []
    for cmd in commands:
        assert main(shlex.split(cmd)[3:]) == 0, cmd
        printed.append(json.loads(capsys.readouterr().out.split("\n\n")[0]))
    for p in found:
        assert p in printed, f"{path}: {p} is not what its command prints now ({printed})"
