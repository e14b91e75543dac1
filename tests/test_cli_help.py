"""Every subcommand and every argument of ``malletrain`` says what it is for."""

from __future__ import annotations

import argparse

from malletrain.cli import build_parser


def _walk(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """Names of the subcommands and arguments under ``parser`` that have no help text."""
    missing: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if not (helped.get(name) or "").strip():
                    missing.append(f"{path} {name} (subcommand)")
                if not (sub.description or "").strip():
                    missing.append(f"{path} {name} (description)")
                missing += _walk(sub, f"{path} {name}")
        elif isinstance(action, argparse._HelpAction):
            continue
        elif not (action.help or "").strip() or action.help == argparse.SUPPRESS:
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_subcommand_and_argument_has_help() -> None:
    assert _walk(build_parser(), "malletrain") == []


def test_the_walk_finds_a_missing_help() -> None:
    parser = argparse.ArgumentParser(prog="x")
    sub = parser.add_subparsers()
    p = sub.add_parser("go", help="go somewhere", description="Go somewhere.")
    p.add_argument("where")
    q = sub.add_parser("stay")
    q.add_argument("--long", help="how long")
    assert _walk(parser, "x") == ["x go where", "x stay (subcommand)", "x stay (description)"]


def _help_of(argv: list[str], dest: str) -> str:
    parser = build_parser()
    for a in argv:
        sub = next(x for x in parser._actions if isinstance(x, argparse._SubParsersAction))
        parser = sub.choices[a]
    return next(x.help for x in parser._actions if x.dest == dest) or ""


def test_config_help_points_at_the_docs_not_at_a_source_file() -> None:
    text = _help_of(["daemon"], "config")
    assert ".py" not in text and "docs/operators.md" in text


def test_simulate_policy_help_names_the_presets_as_the_docs_do() -> None:
    from policy import PRESETS

    text = _help_of(["simulate"], "policy")
    assert "JPA-profiled" not in text
    for name in ("malletrain", "jpa", "freetrain", "milp-true", "oracle", "greedy", "equal"):
        assert name in PRESETS and name in text
