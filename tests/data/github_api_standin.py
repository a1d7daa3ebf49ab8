"""Stands in for `gh api` (GitHub's REST API, which a test cannot reach): the calls the comment step
makes, on a pull request and its comments kept in a JSON file ($GITHUB_STANDIN_STATE), every call
recorded. `--jq` filters go through the real `jq`, as gh's own filter would. A call the state lists
under "fail" ("METHOD path" → GitHub's message and status) fails as gh fails on an HTTP error: the
message on stderr, exit 1, nothing on stdout."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    state_path = Path(os.environ["GITHUB_STANDIN_STATE"])
    state = json.loads(state_path.read_text())
    state["calls"].append(argv)
    assert argv[0] == "api", f"only `gh api` stands in here, not {argv[0]}"
    method, path, jq, fields = "GET", "", None, {}
    args = iter(argv[1:])
    for arg in args:
        if arg == "--method":
            method = next(args)
        elif arg == "--jq":
            jq = next(args)
        elif arg == "-F":
            key, _, value = next(args).partition("=")
            fields[key] = Path(value[1:]).read_text() if value.startswith("@") else value
        elif arg == "--paginate":
            pass
        elif arg.startswith("-"):
            raise SystemExit(f"the stand-in does not know {arg}")
        else:
            path = arg
    if failure := state.get("fail", {}).get(f"{method} {path}"):
        state_path.write_text(json.dumps(state, indent=2))
        sys.stderr.write(f"gh: {failure}\n")
        return 1
    answer = respond(state, method, path, fields)
    state_path.write_text(json.dumps(state, indent=2))
    text = json.dumps(answer)
    if jq is not None:
        text = subprocess.run(["jq", "-r", jq], input=text, capture_output=True, text=True, check=True).stdout
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def respond(state: dict[str, Any], method: str, path: str, fields: dict[str, str]) -> Any:
    repo = re.escape(state["repo"])
    if m := re.fullmatch(rf"repos/{repo}/pulls/(\d+)", path):
        return {"number": int(m[1]), "head": {"sha": state["pulls"][m[1]]}}
    if (m := re.fullmatch(rf"repos/{repo}/issues/(\d+)/comments", path)) and method == "GET":
        return [c for c in state["comments"] if c["pr"] == int(m[1])]
    if (m := re.fullmatch(rf"repos/{repo}/issues/(\d+)/comments", path)) and method == "POST":
        comment = {"id": 1000 + len(state["comments"]), "pr": int(m[1]), "body": fields["body"]}
        comment["user"] = {"login": "github-actions[bot]"}
        state["comments"].append(comment)
        return comment
    if (m := re.fullmatch(rf"repos/{repo}/issues/comments/(\d+)", path)) and method == "PATCH":
        comment = next(c for c in state["comments"] if c["id"] == int(m[1]))
        comment["body"] = fields["body"]
        return comment
    raise SystemExit(f"the stand-in has no answer for {method} {path}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
