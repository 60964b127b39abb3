"""scripts/build_reference_corpus.py on small fixtures in the published layouts."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_reference_corpus.py"


@pytest.fixture(scope="module")
def brc():
    spec = importlib.util.spec_from_file_location("build_reference_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_reference_corpus"] = module
    spec.loader.exec_module(module)
    return module


GCIDE_ENTRIES = [
    # (headword for the index, entry text as in gcide.dict)
    (
        "Accrue",
        'Accrue \\Ac*crue"\\ ([a^]k*kr[udd]"), v. i. [imp. & p. p.\n'
        "   {Accrued}; p. pr. & vb. n. {Accruing}.] [See {Accrue}, n.]\n"
        "   1. To increase; to augment.\n"
        "      [1913 Webster]\n"
        "\n"
        "            And though power failed, her courage did accrue.\n"
        "                                                  --Spenser.\n"
        "      [1913 Webster]\n"
        "\n"
        "   2. (Law) To come to by way of increase; to arise or spring as a\n"
        "      growth or result. --Abbott.\n"
        "      [1913 Webster]\n",
    ),
    (
        "Accriminate",
        'accriminate \\ac*crim"i*nate\\, v. t. [L. ac- (for ad to) +\n'
        "   criminari.]\n"
        "   To accuse one of a crime in open court. [Obs.] -- {Ac*crim`i*na\"tion}, n.\n"
        "   [1913 Webster]\n",
    ),
    (
        "Bell",
        "Bell \\Bell\\, n. [AS. belle, fr. bellan to bellow. See {Bellow}.]\n"
        "   1. A hollow metallic vessel, shaped like a cup, giving a\n"
        "      ringing sound on being struck.\n"
        "      [1913 Webster]\n"
        "\n"
        "   Syn: chime, gong.\n"
        "        [WordNet 1.5]\n"
        "\n"
        "   {The Liberty Bell}, the famous bell of the State House in\n"
        "      Philadelphia.\n"
        "      [1913 Webster]\n",
    ),
    (
        "Draglink",
        "Draglink \\Drag\"link`\\, n. (Mach.)\n"
        "   (a) A link connecting the cranks of two shafts.\n"
        "   (b) A drawbar used on a heavy farm wagon.\n"
        "       [1913 Webster]\n",
    ),
    (
        "Caf'e",
        "Caf['e] \\Caf['e]\\, n.\n"
        "   A coffee house where a caf['e] noir is served at night.\n"
        "   [1913 Webster]\n",
    ),
]
HEADER = "\n00-database-info\n   This file was converted from the original database on a day.\n"

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64(n: int) -> str:
    out = ""
    while True:
        out = _B64[n % 64] + out
        n //= 64
        if n == 0:
            return out


def write_gcide(folder: Path, with_index: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = HEADER.encode()
    index = [("00-database-info", 1, len(HEADER.encode()) - 1)]
    for head, entry in GCIDE_ENTRIES:
        data = ("\n" + entry).encode()
        index.append((head, len(text) + 1, len(data) - 1))
        text += data
    dz = folder / "gcide.dict.dz"
    with gzip.open(dz, "wb") as fh:
        fh.write(text)
    if with_index:
        (folder / "gcide.index").write_text(
            "".join(f"{h}\t{_b64(o)}\t{_b64(n)}\n" for h, o, n in sorted(index)), encoding="utf-8"
        )
    return dz


EVAL_STSB_DEV = ["A man is playing a flute.", "The cat is sleeping on the sofa."]
EVAL_STSB_TEST = ["Two dogs run through a field.", "A woman is cutting an onion."]
EVAL_SICK = ["A group of kids is playing in a yard", "Nobody is riding the bike"]
EVAL_QNLI = ["What came into force after the new constitution?", "The new constitution came into force that day."]


def write_data(root: Path) -> Path:
    (root / "corpora").mkdir(parents=True)
    (root / "corpora" / "en_wiki_20k_sents.txt").write_text(
        "He designed the cover art for the albums .\n"
        "The new constitution came into force that day .\n"  # a QNLI sentence, differently tokenised
        "\n"
        "he designed the COVER art for the albums.\n"  # a duplicate up to case/punctuation
        "Too short\n"
        "Rivers flow downhill toward the sea .\n",
        encoding="utf-8",
    )
    wn = root / "wordnet"
    wn.mkdir()
    header = "  1 This software and database is being provided to you, the LICENSEE, by  \n"
    (wn / "data.noun").write_text(
        header
        + '00001740 03 n 01 entity 0 000 | that which is perceived or known to exist; "an entity of its own"  \n'
        + '02084071 05 n 01 dog 0 000 | a member of the genus Canis; "the dog barked all night"; "a man is playing a flute"  \n',
        encoding="utf-8",
    )
    (wn / "data.verb").write_text(header + '01 29 v 01 run 0 000 | move fast by using one\'s feet; "Don\'t run--you\'ll slip"  \n', encoding="utf-8")
    (wn / "data.adj").write_text(header, encoding="utf-8")
    (wn / "data.adv").write_text(header, encoding="utf-8")
    sts = root / "sts" / "STSBenchmark"
    sts.mkdir(parents=True)

    def stsb(rows):
        return "".join(f"main-captions\tMSRvid\t2012test\t{i:04d}\t3.0\t{a}\t{b}\n" for i, (a, b) in enumerate(rows))

    (sts / "sts-train.csv").write_text(
        stsb([("A plane is taking off.", "An air plane is taking off."), ("a man is playing a flute .", "A boy climbs a tall tree.")]),
        encoding="utf-8",
    )
    (sts / "sts-dev.csv").write_text(stsb([tuple(EVAL_STSB_DEV)]), encoding="utf-8")
    (sts / "sts-test.csv").write_text(stsb([tuple(EVAL_STSB_TEST)]), encoding="utf-8")
    sick = root / "sts" / "SICK"
    sick.mkdir(parents=True)
    head = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
    (sick / "SICK_train.txt").write_text(head + f"1\t{EVAL_SICK[0]}\t{EVAL_SICK[1]}\t4.5\tNEUTRAL\n", encoding="utf-8")
    (sick / "SICK_trial.txt").write_text(head, encoding="utf-8")
    (sick / "SICK_test_annotated.txt").write_text(head, encoding="utf-8")
    (root / "qnli").mkdir()
    (root / "qnli" / "dev.tsv").write_text(
        f"index\tquestion\tsentence\tlabel\n0\t{EVAL_QNLI[0]}\t{EVAL_QNLI[1]}\tentailment\n", encoding="utf-8"
    )
    return root


def test_gcide_markup_removed(brc, tmp_path):
    dz = write_gcide(tmp_path / "dictd")
    lines = list(brc.read_gcide(dz))
    assert lines == [
        "To increase; to augment.",
        "And though power failed, her courage did accrue.",
        "To come to by way of increase; to arise or spring as a growth or result.",
        "To accuse one of a crime in open court.",
        "A hollow metallic vessel, shaped like a cup, giving a ringing sound on being struck.",
        "The Liberty Bell, the famous bell of the State House in Philadelphia.",
        "A link connecting the cranks of two shafts.",
        "A drawbar used on a heavy farm wagon.",
        "A coffee house where a cafe noir is served at night.",
    ]
    # without the index the same definitions come out (the database header is skipped)
    assert list(brc.read_gcide(write_gcide(tmp_path / "noindex", with_index=False))) == lines


def test_wordnet_gloss_parsing(brc):
    assert brc.parse_wordnet_gloss('a member of the genus Canis; "the dog barked all night"; "a dog\'s life"  ') == [
        "a member of the genus Canis",
        "the dog barked all night",
        "a dog's life",
    ]
    # malformed glosses with an unclosed example keep the tail
    assert brc.parse_wordnet_gloss('goods bought; "she loaded her shopping') == ["goods bought", "she loaded her shopping"]
    assert brc.parse_wordnet_gloss('fine; "he is fine" - Shakespeare') == ["fine", "he is fine"]


def test_build_excludes_evaluation_sentences_and_dedupes(brc, tmp_path):
    data = write_data(tmp_path / "data")
    dz = write_gcide(tmp_path / "dictd")
    out = tmp_path / "out" / "corpus.txt"
    messages: list[str] = []
    stats = brc.build_corpus(data, out, dz, tokenizer=None, seed=1, log=messages.append)
    lines = out.read_text(encoding="utf-8").splitlines()
    keys = [brc.normalize_key(x) for x in lines]
    assert len(keys) == len(set(keys)), "duplicates survived"
    evaluation = EVAL_STSB_DEV + EVAL_STSB_TEST + EVAL_SICK + EVAL_QNLI
    assert not set(keys) & {brc.normalize_key(e) for e in evaluation}
    # one QNLI sentence in wiki, one STS-B dev sentence in WordNet examples and one in STS-B train
    assert stats["sources"]["wiki"]["excluded_eval"] == 1
    assert stats["sources"]["wordnet"]["excluded_eval"] == 1
    assert stats["sources"]["stsb"]["excluded_eval"] == 1
    assert stats["excluded_by_eval_set"] == {"qnli-dev": 1, "stsb-dev": 2}
    assert stats["sources"]["wiki"]["duplicates"] == 1
    assert stats["total"]["excluded_eval"] == 3
    assert any("evaluation sentences removed: 3" in m for m in messages)
    # every kept source line is there, and only those
    assert stats["total"]["kept"] == len(lines)
    assert "He designed the cover art for the albums ." in lines
    assert "A boy climbs a tall tree." in lines
    assert "A link connecting the cranks of two shafts." in lines
    for line in lines:
        assert not any(m in line for m in ("[1913", "{", "}", "\\", "--Spenser", "[Obs.]", "[a^]")), line
    # word counts are whitespace words of the kept lines
    assert stats["total"]["words"] == sum(len(x.split()) for x in lines)
    assert json.loads((out.parent / "corpus.txt.stats.json").read_text())["total"]["kept"] == len(lines)
    # shuffling is seeded
    again = tmp_path / "again.txt"
    brc.build_corpus(data, again, dz, tokenizer=None, seed=1, log=lambda *_: None)
    assert again.read_text() == out.read_text()


def test_token_counts_with_tokenizer(brc, tmp_path, tiny_bert):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_bert)
    data = write_data(tmp_path / "data")
    out = tmp_path / "corpus.txt"
    stats = brc.build_corpus(data, out, None, tokenizer=tok, log=lambda *_: None, shuffle=False)
    wiki = [x for x in out.read_text().splitlines()][: stats["sources"]["wiki"]["kept"]]
    assert stats["sources"]["wiki"]["tokens"] == sum(len(tok(x, add_special_tokens=False)["input_ids"]) for x in wiki)
    assert stats["sources"]["gcide"].get("kept", 0) == 0


def test_missing_gcide_message(brc, tmp_path, capsys):
    data = write_data(tmp_path / "data")
    rc = brc.main(["--data-dir", str(data), "--output", str(tmp_path / "c.txt"), "--gcide", str(tmp_path / "nope.dz")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "GCIDE dictionary not found" in err and "apt-get install dict-gcide" in err and "--skip-gcide" in err
    assert not (tmp_path / "c.txt").exists()
    rc = brc.main(["--data-dir", str(data), "--output", str(tmp_path / "c.txt"), "--skip-gcide"])
    assert rc == 0 and (tmp_path / "c.txt").exists()


def test_missing_evaluation_set_is_an_error(brc, tmp_path, capsys):
    data = write_data(tmp_path / "data")
    (data / "qnli" / "dev.tsv").unlink()
    rc = brc.main(["--data-dir", str(data), "--output", str(tmp_path / "c.txt"), "--skip-gcide"])
    assert rc == 2
    assert "qnli-dev" in capsys.readouterr().err
