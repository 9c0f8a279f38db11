"""The papers' tables in a catalogue against the papers' text: every transcribed number is looked
up in the text of its paper, so that a typo in a catalogue fails a test instead of misleading a
reader.

A claim's quote (the paper's words) must appear in the text, markup and spacing aside. And each
table, claim and paper is written once, in one params file (`written_twice`): a study that shows
some rows of a table names the catalogue it is transcribed in.
A row's printed values (its columns in the paper's order) must appear as one contiguous run of
numbers in the paper's text, per split: the row as the paper prints it. A summary row (Average,
Std) likewise; a paper's data sizes appear as written ("141,498" or "141498").
"""
from __future__ import annotations

import re
from pathlib import Path

from minbert.params.studies import Params

TRANSCRIBED = ("dev", "test")    # a row's keys that transcribe the paper (its printed values)

# a number with a decimal point, as tables print them; "- 0.048" (a minus set apart) included
NUMBER = re.compile(r"(?<![\w.])(-\s?)?(\d*\.\d+)(?![\w.]*\d)")


def paper_file(papers_dir: str | Path, paper_id: str) -> Path | None:
    """The text of paper `paper_id` (`<id>_*.txt` in the folder), or None."""
    found = sorted(Path(papers_dir).glob(f"{paper_id}_*.txt"))
    return found[0] if found else None


def numbers(text: str) -> list[float]:
    """Every decimal number of the text, in order."""
    return [float((m.group(1) or "").replace(" ", "") + m.group(2)) for m in NUMBER.finditer(text)]


def plain(text: str) -> str:
    """Text for matching a quote: no markup (TeX dollars and backslashes, emphasis stars), one space
    between words, lower case."""
    return " ".join(re.sub(r"[$\\*]", "", text).split()).lower()


def _contains_run(haystack: list[float], run: list[float]) -> bool:
    n = len(run)
    return any(all(abs(haystack[i + k] - run[k]) < 1e-9 for k in range(n)) for i in range(len(haystack) - n + 1))


def transcription_problems(params: Params, papers_dir: str | Path) -> list[str]:
    """Every transcribed value that the paper's text does not print (one line each); [] when all
    are found. Papers whose text is not in the folder are skipped."""
    problems = []
    texts = {}
    for pid in params.papers:
        path = paper_file(papers_dir, pid)
        if path is not None:
            texts[pid] = path.read_text(encoding="utf-8")
    for pid, paper in params.papers.items():
        if pid not in texts:
            continue
        for section in ("data", "totals"):
            for task, n in getattr(paper, section).items():
                if f"{n:,}" not in texts[pid] and str(n) not in texts[pid]:
                    problems.append(f"papers.{pid}.{section}.{task}: {n} is not in the paper's text")
    for st in params.studies:
        if st.paper is None or st.paper.id not in texts:
            continue
        words = plain(texts[st.paper.id])
        for c in st.paper.claims:
            if c.quote and plain(c.quote) not in words:
                problems.append(f"study {st.name} ({st.paper.id} {st.paper.table}) claim '{c.text}': its quote "
                                f"\"{c.quote}\" is not in the paper's text")
        for task, n in st.paper.data.items():
            if f"{n:,}" not in texts[st.paper.id] and str(n) not in texts[st.paper.id]:
                problems.append(f"study {st.name} ({st.paper.id} {st.paper.table}) data.{task}: {n} is not in the "
                                f"paper's text")
        found = numbers(texts[st.paper.id])
        order = [c.name for c in st.paper.columns]
        printed = [(f"row '{r.label}' {split}", getattr(r, split)) for r in st.paper.rows for split in ("dev", "test")]
        printed += [(f"summary {kind}", values) for kind, values in st.paper.summary.items()]
        for what, values in printed:
            run = [values[c] for c in order if c in values]
            if run and not _contains_run(found, run):
                shown = ", ".join(f"{c} {values[c]:g}" for c in order if c in values)
                problems.append(f"study {st.name} ({st.paper.id} {st.paper.table}) {what}: {shown} is not printed "
                                f"in that order in the paper's text")
    return problems


def written_twice(files: dict[str, dict]) -> list[str]:
    """Every paper (its title, formula and sizes), table (its printed values, columns) and claim
    that more than one of the params files (`files`: name -> YAML content) writes, and every table
    that names the catalogue it is transcribed in (`transcribed_in`) and still writes what it takes
    from there; [] when each is written once."""
    where: dict[tuple, list[str]] = {}
    problems = []
    for name, raw in files.items():
        papers = raw.get("papers") if isinstance(raw, dict) else None
        for pid, paper in (papers or {}).items():
            if isinstance(paper, dict) and "title" in paper:
                where.setdefault(("paper", pid), []).append(name)
        studies = raw.get("studies") if isinstance(raw, dict) else None
        for st in studies or []:
            paper = st.get("paper") if isinstance(st, dict) else None
            if not isinstance(paper, dict):
                continue
            table = (paper.get("id"), paper.get("table"))
            if paper.get("transcribed_in"):
                own = [k for k in ("columns", "claims", "summary", "data") if k in paper] + \
                    [f"rows.{r.get('label')}.{k}" for r in paper.get("rows") or [] if isinstance(r, dict)
                     for k in TRANSCRIBED if k in r]
                problems += [f"{name}: study '{st.get('name')}' takes {table[0]} {table[1]} from "
                             f"params/{paper['transcribed_in']}.yaml and writes its {k} again" for k in own]
                continue
            where.setdefault(("table", *table), []).append(name)
            for c in paper.get("claims") or []:
                if isinstance(c, dict):
                    rows = tuple(c.get("same") or c.get("no_gain") or (c.get("better"), c.get("worse")))
                    where.setdefault(("claim", *table, rows, c.get("column"), c.get("split", "dev")), []).append(name)
    for key, names in where.items():
        if len(names) > 1:
            what = f"paper {key[1]}" if key[0] == "paper" else f"{key[1]} {key[2]}" if key[0] == "table" else \
                f"the claim of {key[1]} {key[2]} on {key[4]} between {' and '.join(map(str, key[3]))}"
            problems.append(f"{what} is written in {len(names)} places ({', '.join(names)}); write it once and "
                            f"name it (`transcribed_in`) where it is shown")
    return problems
