"""`dvc plots show` offline. DVC's plots page loads vega, vega-lite and vega-embed from a CDN, so
without a network it is blank; `.dvc/config` names a page template instead (`plots.html_template =
plots.html`), and this writes that template, `.dvc/plots.html`: DVC's page with the three scripts
inlined from the copies Snakemake ships with its own reports (snakemake/assets/data: the same
libraries, with their licences). DVC fills in the plots (`{plot_divs}`); the page opens from disk.

    python -m workflow.dvc_plots          # scripts/install.sh and the `resolve` stage run it
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = "plots.html"                 # in .dvc/, as .dvc/config names it
SCRIPTS = ("vega/vega.js", "vega-lite/vega-lite.js", "vega-embed/vega-embed.js")


def assets() -> Path:
    import snakemake

    return Path(snakemake.__file__).parent / "assets" / "data"


def page() -> str:
    """DVC's plots page with vega, vega-lite and vega-embed inlined (no `{scripts}`: DVC would add
    the CDN links there)."""
    scripts = []
    for name in SCRIPTS:
        code = (assets() / name).read_text(encoding="utf-8").replace("</script", "<\\/script")
        scripts.append(f"<script>\n{code}\n</script>")
    head = "\n".join(["<!DOCTYPE html>", "<html>", "<head>", "{refresh_tag}", '<meta charset="utf-8">',
                      "<title>DVC Plot</title>", *scripts, "<style>table { border-spacing: 15px; }</style>", "</head>"])
    return head + "\n<body>\n{plot_divs}\n</body>\n</html>\n"


def write_template(repo: Path = REPO) -> Path | None:
    """Write .dvc/plots.html when the project is a DVC project and it is missing or differs."""
    dvc_dir = Path(repo) / ".dvc"
    if not dvc_dir.is_dir():
        return None
    path = dvc_dir / TEMPLATE
    text = page()
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        tmp = path.with_name(f".{TEMPLATE}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return path


if __name__ == "__main__":
    written = write_template(Path.cwd())
    print(f"wrote {written}" if written else "not a DVC project (no .dvc/): nothing to do", file=sys.stderr)
