"""`blendserve ingest` refuses bad options before it starts Ray, naming what is wrong."""
from pathlib import Path

from typer.testing import CliRunner

from cluster.cli import app


def test_bad_options_are_refused_before_ray_starts(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "text": "b"}\n')
    runner = CliRunner()
    for options, expected in ((["--chunk", "words:5"], "'row' or 'tokens:N'"),
                              (["--tenant", "a b"], "tenant must be 1 to 64 letters"),
                              (["--text-column", "id"], "two named columns"),
                              (["--actors", "0"], "greater than or equal to 1")):
        result = runner.invoke(app, ["ingest", str(corpus), *options])
        assert result.exit_code == 2 and expected in result.output, result.output
