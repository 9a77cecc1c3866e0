"""``captioner fetch-spice``: install the jars SPICE needs on Java 17 (see eval.spice_jars)."""

from __future__ import annotations

from pathlib import Path

from captioner.commands.options import CommandParser, report_error

HELP = "download and verify the Stanford CoreNLP and Nashorn jars that SPICE needs"


def main(argv: list[str]) -> int:
    from eval.spice_jars import SpiceJarsError, default_maven_repo, fetch_spice, spice_cache_dir

    parser = CommandParser(prog="captioner fetch-spice", description=HELP)
    parser.add_argument(
        "--cache-dir",
        help=f"where to install (default: $CAPTIONER_SPICE_DIR or {spice_cache_dir(None)})",
    )
    parser.add_argument(
        "--maven-repo",
        default=str(default_maven_repo()),
        help="local Maven repository to take jars from first (default: %(default)s)",
    )
    parser.add_argument(
        "--no-mvn",
        action="store_true",
        help="never run 'mvn dependency:get'; download missing jars over HTTPS instead",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars or log lines")
    args = parser.parse_args(argv)
    from data_prep.paths import check_output_dir

    try:
        check_output_dir(spice_cache_dir(args.cache_dir))
    except ValueError as exc:
        return report_error("captioner fetch-spice", exc)
    try:
        install = fetch_spice(
            args.cache_dir,
            maven_repo=Path(args.maven_repo).expanduser(),
            use_mvn=not args.no_mvn,
            progress=not args.quiet,
            log=(lambda _: None) if args.quiet else print,
        )
    except (SpiceJarsError, OSError) as exc:
        return report_error("captioner fetch-spice", exc, status=1)
    print(f"SPICE is ready in {install.root}")
    return 0
