"""`python -m moejax.policies --list`: every registered policy, one line each.

A line is the policy's kind, a space, its spec with every spec argument at its default
(`prefetch score_percentile(p=80.0, lookahead=1)`; a required argument stands bare), then
`[replay only]` for a policy that cannot run live, and ` -- ` with the first sentence of its
docstring. Kinds come in the registry's order (`moejax.policies.base.KINDS`: eviction, prefetch,
miss, routing), names sorted within a kind. Without arguments it prints the same list. README's
policy list is this output. `--modules=my_policies.py` lists a user's policies too; installed
packages' (entry point group `moejax.policies`) are always listed.
"""

from __future__ import annotations

import inspect
import sys

from moejax import cli
from moejax.policies import KINDS, Policy, names, policy_class, spec_arguments, user_modules

PROG = "python -m moejax.policies"
SUMMARY_WIDTH = 72  # the docstring's first sentence is cut (at a word) beyond this


def summary(cls: type[Policy]) -> str:
    """The first sentence of the class's own docstring (up to the first `. ` outside brackets
    and backquotes, without its `.`), cut to `SUMMARY_WIDTH`; "" when the class has none."""
    text = " ".join((cls.__dict__.get("__doc__") or "").split("\n\n")[0].split())
    depth, quoted, end = 0, False, len(text)
    for i, ch in enumerate(text):
        if ch == "`":
            quoted = not quoted
        elif quoted:
            continue
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "." and depth <= 0 and (i + 1 == len(text) or text[i + 1] == " "):
            end = i
            break
    text = text[:end]
    if len(text) > SUMMARY_WIDTH:
        text = text[:SUMMARY_WIDTH - 3].rsplit(" ", 1)[0].rstrip(",;:") + "..."
    return text


def spec(name: str, cls: type[Policy]) -> str:
    """`name(arg=default, ...)`, or the bare name when it takes no spec argument."""
    args = [key if default is inspect.Parameter.empty else f"{key}={default!r}"
            for key, default in spec_arguments(cls).items()]
    return f"{name}({', '.join(args)})" if args else name


def lines() -> list[str]:
    out = []
    for kind in KINDS:
        for name in names(kind):
            cls = policy_class(kind, name)
            line = f"{kind} {spec(name, cls)}"
            if cls.replay_only:
                line += " [replay only]"
            about = summary(cls)
            out.append(f"{line} -- {about}" if about else line)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = cli.ArgumentParser(
        prog=PROG, description="Lists the registered expert-cache policies: kind, spec with "
        "its arguments' defaults, what it is. Without arguments, the same as --list.")
    ap.add_argument("--list", action="store_true",
                    help="one line per registered policy (the default)")
    ap.add_argument("--modules", default="", metavar="FILES",
                    help="your own policies' files or modules, comma-separated, listed too "
                         "(as --config.policies.modules loads them)")
    args = ap.parse_args(sys.argv[1:] if argv is None else list(argv))

    def show():
        user_modules.load(args.modules)  # and the installed packages' entry points
        print("\n".join(lines()))

    return cli.guarded(PROG, show)


if __name__ == "__main__":
    sys.exit(main())
