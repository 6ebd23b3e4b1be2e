"""voicectl entry point: routing and error rendering."""
import voiceapp.cli as cli


def test_bare_voicectl_flags_route_to_the_tui():
    seen = {}

    def fake_run(args):
        seen["command"], seen["backend"] = args.command, args.backend
        return 0

    parser = cli.build_parser()
    tui = parser._subparsers._group_actions[0].choices["tui"]
    tui.set_defaults(run=fake_run)
    original = cli.build_parser
    cli.build_parser = lambda: parser
    try:
        assert cli.main(["--backend", "fake"]) == 0
    finally:
        cli.build_parser = original
    assert seen == {"command": "tui", "backend": "fake"}
