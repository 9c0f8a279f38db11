"""A small, deterministic demo data set in the CS224N layout, for the embedded default pipeline.

    python -m minbert.data.demo --out data/demo

Writes ids-sst-*, quora-* and sts-* {train, dev, test-student}.csv (test-student without labels),
nli-sample.jsonl (SNLI format) and README.md, which says what the data is (its first line marks the
folder as the demo data: minbert.core.datasets; a model card says it was trained on synthetic data). Sentences come from templates and small graded lexicons, so
a pretrained sentence encoder learns the tasks within a couple of epochs, yet no single word
gives the label away:

- sentiment (5 levels): graded adjectives (terrible ... brilliant) with intensifiers, negation
  ("not good" -> 1) and two-clause sentences whose label is the mean of the clauses, plus a
  little label noise;
- paraphrase: how/why/cost questions about an action on an object; duplicates are rewrites with
  synonyms and another question frame, non-duplicates change one of question type, verb or
  object (and often keep the frame), so word overlap alone does not decide;
- similarity (0-5): scene sentences "a <subject> is <action> <place>"; the score band follows
  how much of subject / action / place two sentences share (synonyms count as shared);
- NLI: each scene premise gets an entailed (more general), a neutral (added detail) and a
  contradicting (changed action, place or negated) hypothesis.

Everything is drawn from one seeded `random.Random`, so the output is byte-for-byte stable.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pandas as pd

from minbert.core.datasets import DEMO_MARKER, DEMO_TITLE
from minbert.core.io import write_text
from minbert.core.tasks import TASKS
from minbert.data.raw import raw_path, write_cs224n

SEED = 224
SIZES = {"train": 600, "dev": 200, "test": 200}
NLI_PREMISES = 200          # x 3 hypotheses = 600 rows

# ---------------------------------------------------------------- sentiment

SENTIMENT_WORDS = {
    0: ["terrible", "awful", "dreadful", "horrible", "atrocious", "unbearable", "abysmal"],
    1: ["dull", "disappointing", "weak", "bland", "tedious", "forgettable", "clumsy"],
    2: ["okay", "average", "ordinary", "passable", "uneven", "acceptable", "middling"],
    3: ["good", "enjoyable", "pleasant", "solid", "charming", "likable", "engaging"],
    4: ["brilliant", "wonderful", "superb", "outstanding", "magnificent", "masterful", "extraordinary"],
}
FILM_PARTS = ["film", "movie", "story", "acting", "script", "soundtrack", "ending", "cast", "dialogue",
              "plot", "direction", "pacing", "cinematography", "humor", "lead performance", "sequel"]
INTENSIFIERS = ["", "", "really ", "truly ", "rather ", "quite ", "mostly "]
SINGLE_FRAMES = ["The {n} is {a} .", "The {n} was {a} .", "I thought the {n} was {a} .",
                 "Overall , the {n} felt {a} .", "Honestly , the {n} is {a} .", "The {n} seemed {a} to me ."]
NEGATED_FRAMES = ["The {n} was not {a} .", "I would not call the {n} {a} .", "The {n} is hardly {a} ."]
# negating a word of level k reads as level NEGATED[k]
NEGATED = {0: 2, 1: 2, 3: 1, 4: 1}
PAIR_FRAMES = ["The {n} was {a} , but the {m} was {b} .", "The {n} is {a} and the {m} is {b} .",
               "While the {n} felt {a} , the {m} felt {b} ."]


def _sentiment(rng: random.Random, label: int) -> tuple[str, int]:
    kind = rng.random()
    if kind < 0.2 and label in (1, 2):
        word_level = rng.choice([k for k, v in NEGATED.items() if v == label])
        text = rng.choice(NEGATED_FRAMES).format(n=rng.choice(FILM_PARTS),
                                                 a=rng.choice(SENTIMENT_WORDS[word_level]))
    elif kind < 0.5:
        # two clauses; the label is their mean, rounded down
        while True:
            a = rng.randrange(5)
            b = 2 * label + rng.randrange(2) - a
            if 0 <= b <= 4:
                break
        n, m = rng.sample(FILM_PARTS, 2)
        text = rng.choice(PAIR_FRAMES).format(n=n, m=m, a=rng.choice(SENTIMENT_WORDS[a]),
                                              b=rng.choice(SENTIMENT_WORDS[b]))
    else:
        adj = rng.choice(INTENSIFIERS) + rng.choice(SENTIMENT_WORDS[label])
        text = rng.choice(SINGLE_FRAMES).format(n=rng.choice(FILM_PARTS), a=adj)
    if rng.random() < 0.08:   # annotators disagree now and then
        label = min(4, max(0, label + rng.choice([-1, 1])))
    return text, label


# ---------------------------------------------------------------- paraphrase

VERBS = [["fix", "repair"], ["clean", "wash"], ["buy", "purchase"], ["sell", "get rid of"],
         ["choose", "pick"], ["paint", "repaint"], ["insure", "get insurance for"], ["rent", "lease"]]
OBJECTS = [["car", "automobile"], ["bike", "bicycle"], ["laptop", "notebook computer"],
           ["phone", "smartphone"], ["house", "home"], ["sofa", "couch"], ["boat", "small boat"],
           ["apartment", "flat"], ["motorcycle", "motorbike"], ["guitar", "acoustic guitar"]]
QUESTION_FRAMES = {
    "how": ["How do I {v} a {o}?", "How can I {v} my {o}?", "What is the best way to {v} a {o}?",
            "What is the easiest way to {v} my {o}?"],
    "why": ["Why do people {v} a {o}?", "What are the reasons to {v} a {o}?",
            "Why would someone {v} their {o}?"],
    "cost": ["How much does it cost to {v} a {o}?", "What is the price to {v} a {o}?",
             "How expensive is it to {v} my {o}?"],
}


def _question(rng: random.Random, qtype: str, verb: int, obj: int, frame: int | None = None) -> tuple[str, int]:
    frames = QUESTION_FRAMES[qtype]
    f = rng.randrange(len(frames)) if frame is None else frame
    return frames[f].format(v=rng.choice(VERBS[verb]), o=rng.choice(OBJECTS[obj])), f


def _paraphrase(rng: random.Random, label: int) -> tuple[str, str, int]:
    qtype, verb, obj = rng.choice(list(QUESTION_FRAMES)), rng.randrange(len(VERBS)), rng.randrange(len(OBJECTS))
    q1, f1 = _question(rng, qtype, verb, obj)
    if label == 1:
        while True:
            q2, _ = _question(rng, qtype, verb, obj)
            if q2 != q1:
                break
    else:
        change = rng.choices(["object", "verb", "qtype"], weights=[0.45, 0.35, 0.2])[0]
        if change == "qtype":
            qtype2 = rng.choice([q for q in QUESTION_FRAMES if q != qtype])
            q2, _ = _question(rng, qtype2, verb, obj)
        else:
            verb2 = rng.choice([v for v in range(len(VERBS)) if v != verb]) if change == "verb" else verb
            obj2 = rng.choice([o for o in range(len(OBJECTS)) if o != obj]) if change == "object" else obj
            same_frame = f1 if rng.random() < 0.6 else None   # often the very same wording but one word
            q2, _ = _question(rng, qtype, verb2, obj2, same_frame)
    if rng.random() < 0.03:
        label = 1 - label
    return (q1, q2, label) if rng.random() < 0.5 else (q2, q1, label)


# ---------------------------------------------------------------- scenes: similarity and NLI

SUBJECTS = [["man", "guy"], ["woman", "lady"], ["child", "kid"], ["girl", "young girl"],
            ["boy", "young boy"], ["chef", "cook"], ["musician", "performer"], ["student", "pupil"]]
SUBJECT_GENERAL = {0: "person", 1: "person", 2: "person", 3: "child", 4: "child", 5: "person",
                   6: "person", 7: "person"}
ACTIONS = [["playing a guitar", "playing the guitar"], ["riding a bike", "riding a bicycle"],
           ["cooking dinner", "making dinner"], ["reading a book", "reading a novel"],
           ["running", "jogging"], ["eating an apple", "eating a piece of fruit"],
           ["painting a picture", "painting a canvas"], ["singing a song", "singing a tune"],
           ["writing a letter", "writing a note"], ["walking a dog", "walking a puppy"]]
ACTION_GENERAL = ["playing music", "riding something", "preparing food", "reading", "moving",
                  "eating", "making art", "making music", "writing", "walking"]
PLACES = [["in the park", "at the park"], ["on the beach", "by the sea"], ["in the kitchen", "in a kitchen"],
          ["on the street", "on a road"], ["at home", "in the house"], ["in a library", "at the library"],
          ["on a stage", "on the stage"], ["in the garden", "in a backyard"]]
PLACE_GENERAL = ["outdoors", "outdoors", "indoors", "outdoors", "indoors", "indoors", "indoors", "outdoors"]
NEUTRAL_ADDITIONS = ["for a friend", "on a sunny afternoon", "after a long day", "to win a contest",
                     "with great concentration", "for the first time"]


def _scene(rng, s, a, p, syn: bool = False) -> str:
    pick = (lambda xs: xs[1]) if syn else (lambda xs: xs[0])
    if syn and rng.random() < 0.5:
        pick = lambda xs: rng.choice(xs)  # noqa: E731 - a partial rewrite is still a paraphrase
    place = "" if p is None else " " + pick(PLACES[p])
    subj = pick(SUBJECTS[s])
    article = "An" if subj[0] in "aeiou" else "A"
    return f"{article} {subj} is {pick(ACTIONS[a])}{place}."


def _other(rng, n: int, not_this: int) -> int:
    return rng.choice([i for i in range(n) if i != not_this])


def _similarity(rng: random.Random, band: int) -> tuple[str, str, float]:
    s, a, p = rng.randrange(len(SUBJECTS)), rng.randrange(len(ACTIONS)), rng.randrange(len(PLACES))
    first = _scene(rng, s, a, p)
    S, A, P = len(SUBJECTS), len(ACTIONS), len(PLACES)
    if band == 5:
        second = _scene(rng, s, a, p, syn=True)
    elif band == 4:
        second = _scene(rng, s, a, None, syn=rng.random() < 0.5)
    elif band == 3:
        second = _scene(rng, s, a, _other(rng, P, p), syn=rng.random() < 0.5)
    elif band == 2:
        second = _scene(rng, s, _other(rng, A, a), p, syn=rng.random() < 0.5)
    elif band == 1:
        if rng.random() < 0.5:
            second = _scene(rng, _other(rng, S, s), _other(rng, A, a), p)
        else:
            second = _scene(rng, s, _other(rng, A, a), _other(rng, P, p))
    else:
        second = _scene(rng, _other(rng, S, s), _other(rng, A, a), _other(rng, P, p))
    score = min(5.0, max(0.0, band + rng.uniform(-0.4, 0.4) - (0.3 if band == 5 else 0)))
    pair = (first, second) if rng.random() < 0.5 else (second, first)
    return pair[0], pair[1], round(score, 1)


def _nli_rows(rng: random.Random, caption: str) -> list[dict]:
    s, a, p = rng.randrange(len(SUBJECTS)), rng.randrange(len(ACTIONS)), rng.randrange(len(PLACES))
    premise = _scene(rng, s, a, p)
    subj = SUBJECTS[s][0]
    entail = rng.choice([f"A {SUBJECT_GENERAL[s]} is {ACTION_GENERAL[a]}.",
                         f"A {subj} is {PLACE_GENERAL[p]}.",
                         f"Someone is {ACTIONS[a][1]}."])
    neutral = rng.choice([f"A {subj} is {ACTIONS[a][0]} {rng.choice(NEUTRAL_ADDITIONS)}.",
                          f"The {subj} is {ACTIONS[a][0]} {PLACES[p][0]} {rng.choice(NEUTRAL_ADDITIONS)}.",
                          f"A tired {subj} is {ACTIONS[a][0]}."])
    contra = rng.choice([f"A {subj} is {ACTIONS[_other(rng, len(ACTIONS), a)][0]} {PLACES[p][0]}.",
                         f"Nobody is {ACTIONS[a][0]}.",
                         f"A {subj} is sleeping {PLACES[_other(rng, len(PLACES), p)][0]}."])
    rows = [{"captionID": caption, "pairID": f"{caption}r1{lab[0]}", "sentence1": premise, "sentence2": hyp,
             "gold_label": lab} for lab, hyp in (("entailment", entail), ("neutral", neutral),
                                                 ("contradiction", contra))]
    rng.shuffle(rows)
    return rows


# ---------------------------------------------------------------- writing the CS224N layout


def _unique_rows(rng: random.Random, make, n: int, seen: set, n_labels: int) -> list[tuple]:
    """n rows, labels cycling through 0..n_labels-1 (balanced), no text repeated across splits."""
    rows = []
    while len(rows) < n:
        row = make(rng, len(rows) % n_labels)
        key = row[:-1]
        if key in seen:
            continue
        seen.add(key)
        rows.append(row)
    rng.shuffle(rows)
    return rows


def _ids(rng: random.Random, n: int) -> list[str]:
    return [format(rng.getrandbits(100), "025x") for _ in range(n)]


# each task's rows: its generator, the label bands it draws evenly, the type its label column is written in
GENERATORS = {"sst": (_sentiment, 5, int), "para": (_paraphrase, 2, float), "sts": (_similarity, 6, float)}


def generate(out: str | Path, seed: int = SEED) -> list[Path]:
    """Write the demo files into `out`; return their paths."""
    out = Path(out)
    rng = random.Random(seed)
    written = []
    for task, (make, n_labels, label_type) in GENERATORS.items():
        spec, seen = TASKS[task], set()
        for split, n in SIZES.items():
            rows = _unique_rows(rng, make, n, seen, n_labels)
            frame = pd.DataFrame(rows, columns=[*spec.raw_text_columns, spec.raw_label_column])
            frame.insert(0, "id", _ids(rng, n))
            frame[spec.raw_label_column] = frame[spec.raw_label_column].astype(label_type)
            if split == "test":
                frame = frame.drop(columns=[spec.raw_label_column])
            path = raw_path(out, task, split)
            write_cs224n(frame, path)
            written.append(path)
    nli = []
    for k in range(NLI_PREMISES):
        nli.extend(_nli_rows(rng, f"demo{k:04d}.jpg#{rng.randrange(5)}"))
    path = out / "nli-sample.jsonl"
    write_text(path, "".join(json.dumps(r) + "\n" for r in nli))
    written.append(path)
    path = out / DEMO_MARKER
    write_text(path, README.format(title=DEMO_TITLE, seed=seed, **SIZES, nli=3 * NLI_PREMISES))
    written.append(path)
    return written


README = """{title}

Synthetic sentences made from templates and small graded lexicons by `python -m minbert.data.demo`
(seed {seed}), in the layout of the CS224N data: {train} training, {dev} dev and {test} test rows per
task (ids-sst-*, quora-*, sts-*; the test files without labels) and {nli} NLI pairs
(nli-sample.jsonl). They stand in for SST-5, Quora and STS so that the pipeline runs offline in
minutes; they are not those data sets, and a model trained on them says how the pipeline works,
not what a method is worth. A model card of a model trained here says so (minbert.share.export).
"""


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Write the demo data set (CS224N layout + SNLI-style jsonl).")
    p.add_argument("--out", default="data/demo", help="output folder (default: data/demo)")
    p.add_argument("--seed", type=int, default=SEED, help=f"random seed (default: {SEED})")
    args = p.parse_args(argv)
    for path in generate(args.out, args.seed):
        print(path)


if __name__ == "__main__":
    main()
