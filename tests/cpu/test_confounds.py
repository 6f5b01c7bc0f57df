"""Confounds are values: a kind, a stage and fields, with the sentence rendered from them; the JSON
report carries them as objects its schema names, and a dump's sentences come back as DECLARED."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from oracle.run.confounds import Confound, ConfoundError, ConfoundKind

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "oracle/report/schema.json").read_text())


def test_a_confound_renders_its_sentence_from_its_fields():
    c = Confound.of(ConfoundKind.TORN_RECORDS, torn=3)
    assert c.fields == (("torn", 3),) and c.field("torn") == 3 and c.incomplete_trace
    assert c.sentence.startswith("incomplete trace: 3 record(s)")
    mixed = Confound.of(ConfoundKind.MIXED_TAPS, "load_b", tap_max=1234.5, input_max=2.0)
    assert mixed.sentence.startswith("load_b taps reach 1234 but no input value exceeds 2")
    assert not mixed.incomplete_trace


@pytest.mark.parametrize("make, said", [
    (lambda: Confound.of(ConfoundKind.TORN_RECORDS), "needs the field(s) torn"),
    (lambda: Confound.of(ConfoundKind.TORN_RECORDS, torn=1, lost="x"), "has no field(s) lost"),
    (lambda: Confound(ConfoundKind.TORN_RECORDS, "", (("dropped", 1),)), "has the fields torn"),
    (lambda: Confound("torn_records", "", (("torn", 1),)), "Confound.kind = 'torn_records' is not allowed"),
    (lambda: Confound.of(ConfoundKind.TORN_RECORDS, torn=[1]), "field torn = [1] must be"),
])
def test_a_confound_that_does_not_fit_its_kind_is_refused_by_name(make, said):
    with pytest.raises(ConfoundError, match=re.escape(said)):
        make()


def test_every_kind_renders_and_the_schema_lists_every_kind():
    kinds = SCHEMA["$defs"]["confound"]["properties"]["kind"]["enum"]
    assert kinds == [k.value for k in ConfoundKind]


def test_the_report_json_holds_confounds_as_objects_the_schema_accepts():
    jsonschema = pytest.importorskip("jsonschema")
    c = Confound.of(ConfoundKind.UNDECLARED_EPILOGUE, tapped="epilogue_bias", declared="alpha > cast")
    doc = c.to_json()
    assert doc == {"kind": "undeclared_epilogue", "stage": "", "fields": {"tapped": "epilogue_bias",
                                                                          "declared": "alpha > cast"},
                   "sentence": c.sentence}
    schema = dict(SCHEMA["$defs"]["confound"], **{"$defs": SCHEMA["$defs"]})
    jsonschema.validate(doc, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dict(doc, kind="something else"), schema)


def test_a_dump_holds_the_sentences_and_reads_them_back_as_declared(tmp_path):
    from dataclasses import replace

    from oracle.run.recording import Recording

    zoo = Recording.load(str(Path(__file__).resolve().parents[1] / "zoo/dumps/hopper_bf16_kblock_twice.safetensors.gz"))
    rec = replace(zoo, confounds=(Confound.of(ConfoundKind.TORN_RECORDS, torn=2),))
    path = str(tmp_path / "rec.safetensors")
    rec.save(path)
    back = Recording.load(path)
    assert back.confounds == (Confound.declared(rec.confounds[0].sentence),)
