"""nicop.kube.selectors on apimachinery's own selector tables (kubernetes/apimachinery
pkg/labels/selector_test.go: TestSelectorParse, TestSelectorMatches,
TestRequirementSelectorMatching, TestSetSelectorParser), and the object forms as core/v1 and
meta/v1 define them."""

from __future__ import annotations

import pytest

from nicop.kube.selectors import (
    DOES_NOT_EXIST,
    EXISTS,
    GT,
    IN,
    NOT_IN,
    Requirement,
    SelectorError,
    matches_label_selector,
    matches_node_selector,
    matches_string,
    parse,
    requirement,
)

# TestSelectorParse: testGoodStrings and testBadStrings.
GOOD = ["x=a,y=b,z=c", "", "x!=a,y=b", "x=", "x= ", "x=,z= ", "x= ,z= ", "!x", "x>1", "x>1,z<5"]
BAD = ["x=a||y=b", "x==a==b", "!x=a", "x<a"]


@pytest.mark.parametrize("text", GOOD)
def test_selector_parse_good_strings(text: str) -> None:
    parse(text)


@pytest.mark.parametrize("text", BAD)
def test_selector_parse_bad_strings(text: str) -> None:
    with pytest.raises(SelectorError):
        parse(text)


# TestSelectorMatches: expectMatch / expectNoMatch.
MATCHES = [
    ("", {"x": "y"}, True), ("x=y", {"x": "y"}, True), ("x=y,z=w", {"x": "y", "z": "w"}, True),
    ("x!=y,z!=w", {"x": "z", "z": "a"}, True), ("notin=in", {"notin": "in"}, True),
    ("x", {"x": "z"}, True), ("!x", {"y": "z"}, True), ("x>1", {"x": "2"}, True),
    ("x<1", {"x": "0"}, True), ("x=z", {}, False), ("x=y", {"x": "z"}, False),
    ("x=y,z=w", {"x": "w", "z": "w"}, False), ("x!=y,z!=w", {"x": "z", "z": "w"}, False),
    ("x", {"y": "z"}, False), ("!x", {"x": "z"}, False), ("x>1", {"x": "0"}, False),
    ("x<1", {"x": "2"}, False),
    ("foo=bar", {"foo": "bar", "baz": "blah"}, True),
    ("baz=blah", {"foo": "bar", "baz": "blah"}, True),
    ("foo=bar,baz=blah", {"foo": "bar", "baz": "blah"}, True),
    ("foo=blah", {"foo": "bar", "baz": "blah"}, False),
    ("baz=bar", {"foo": "bar", "baz": "blah"}, False),
    ("foo=bar,foobar=bar,baz=blah", {"foo": "bar", "baz": "blah"}, False),
]


@pytest.mark.parametrize(("text", "labels", "match"), MATCHES)
def test_selector_matches(text: str, labels: dict[str, str], match: bool) -> None:
    assert matches_string(text, labels) is match


# TestRequirementSelectorMatching.
REQUIREMENTS = [
    ({"x": "foo", "y": "baz"}, [Requirement("", "")], False),
    ({"x": "foo", "y": "baz"}, [("x", IN, ["foo"]), ("y", NOT_IN, ["alpha"])], True),
    ({"x": "foo", "y": "baz"}, [("x", IN, ["foo"]), ("y", IN, ["alpha"])], False),
    ({"y": ""}, [("x", NOT_IN, [""]), ("y", EXISTS, [])], True),
    ({"y": ""}, [("x", DOES_NOT_EXIST, []), ("y", EXISTS, [])], True),
    ({"y": ""}, [("x", NOT_IN, [""]), ("y", DOES_NOT_EXIST, [])], False),
    ({"y": "baz"}, [("x", IN, [""])], False),
    ({"z": "2"}, [("z", GT, ["1"])], True),
    ({"z": "v2"}, [("z", GT, ["1"])], False),
]


@pytest.mark.parametrize(("labels", "reqs", "match"), REQUIREMENTS)
def test_requirement_selector_matching(labels: dict[str, str], reqs: list, match: bool) -> None:
    built = [r if isinstance(r, Requirement) else requirement(*r) for r in reqs]
    assert all(r.matches(labels) for r in built) is match


# TestSetSelectorParser: input, the requirements it parses to (None: not compared), valid.
SET_PARSER = [
    ("", [], True),
    ("\rx", [("x", EXISTS, [])], True),
    ("this-is-a-dns.domain.com/key-with-dash",
     [("this-is-a-dns.domain.com/key-with-dash", EXISTS, [])], True),
    ("this-is-another-dns.domain.com/key-with-dash in (so,what)",
     [("this-is-another-dns.domain.com/key-with-dash", IN, ["so", "what"])], True),
    ("0.1.2.domain/99 notin (10.10.100.1, tick.tack.clock)",
     [("0.1.2.domain/99", NOT_IN, ["10.10.100.1", "tick.tack.clock"])], True),
    ("foo  in\t (abc)", [("foo", IN, ["abc"])], True),
    ("x notin\n (abc)", [("x", NOT_IN, ["abc"])], True),
    ("x  notin\t\t\t(abc,def)", [("x", NOT_IN, ["abc", "def"])], True),
    ("x in (abc,def)", [("x", IN, ["abc", "def"])], True),
    ("x in (abc,)", [("x", IN, ["abc", ""])], True),
    ("x in (abc,abc)", [("x", IN, ["abc"])], True),
    ("x in ()", [("x", IN, [""])], True),
    ("x in (a,,)", [("x", IN, ["a", ""])], True),
    ("x in (a,,,)", [("x", IN, ["a", ""])], True),
    ("x in (a,,,,,,)", [("x", IN, ["a", ""])], True),
    ("x in (a,,a,,a,,a,,)", [("x", IN, ["a", ""])], True),
    ("x notin (abc,,def),bar,z in (),w",
     [("x", NOT_IN, ["abc", "", "def"]), ("bar", EXISTS, []), ("z", IN, [""]),
      ("w", EXISTS, [])], True),
    ("x,y in (a)", None, True),
    ("x=a", [("x", IN, ["a"])], True),
    ("x>1", [("x", GT, ["1"])], True),
    ("x<7", [("x", "Lt", ["7"])], True),
    ("x=a,y!=b", [("x", IN, ["a"]), ("y", NOT_IN, ["b"])], True),
    ("x=a,y!=b,z in (h,i,j)", [("x", IN, ["a"]), ("y", NOT_IN, ["b"]), ("z", IN, ["h", "i", "j"])],
     True),
    ("x=a||y=b", None, False),
    ("x,,y", None, False),
    (",x,y", None, False),
    ("x nott in (y)", None, False),
    ("x notin ( )", [("x", NOT_IN, [""])], True),
    ("x notin (, a)", [("x", NOT_IN, ["", "a"])], True),
    ("a in (xyz),", None, False),
    ("a in (xyz)b notin ()", None, False),
    ("a ", [("a", EXISTS, [])], True),
    ("a in (x,y,notin, z,in)", [("a", IN, ["in", "notin", "x", "y", "z"])], True),
    ("a in (xyz abc)", None, False),
    ("a notin(", None, False),
    ("a (", None, False),
    ("(", None, False),
]


@pytest.mark.parametrize(("text", "parsed", "valid"), SET_PARSER)
def test_set_selector_parser(text: str, parsed: list | None, valid: bool) -> None:
    if not valid:
        with pytest.raises(SelectorError):
            parse(text)
        return
    got = parse(text)
    if parsed is not None:  # apimachinery sorts by key; the order here is the text's
        assert set(got) == {requirement(*r) for r in parsed}


def test_the_drain_selector_of_the_issue_selects_what_it_names() -> None:
    """A set-based podSelector selects the pods it names, and only them."""
    assert matches_string("app in (train,infer)", {"app": "train"})
    assert not matches_string("app in (train,infer)", {"app": "web"})
    assert matches_string("app notin (train,infer)", {"app": "web"})
    assert not matches_string("app notin (train,infer)", {"app": "infer"})


def test_label_selector_objects_as_meta_v1_defines_them() -> None:
    selector = {"matchLabels": {"a": "1"},
                "matchExpressions": [{"key": "b", "operator": "NotIn", "values": ["x"]}]}
    assert matches_label_selector(selector, {"a": "1", "b": "y"})
    assert not matches_label_selector(selector, {"a": "1", "b": "x"})
    assert matches_label_selector({}, {}) and matches_label_selector(None, {"a": "1"})
    with pytest.raises(SelectorError, match=r"matchExpressions\[0\].*operator 'Gt'"):
        matches_label_selector({"matchExpressions": [
            {"key": "b", "operator": "Gt", "values": ["1"]}]}, {})
    with pytest.raises(SelectorError, match="needs at least one value"):
        matches_label_selector({"matchExpressions": [{"key": "b", "operator": "In"}]}, {})


def test_node_selectors_as_core_v1_defines_them() -> None:
    node = {"metadata": {"name": "n1", "labels": {"gpu": "8", "zone": "a"}}}
    assert matches_node_selector(None, node)
    assert not matches_node_selector({"nodeSelectorTerms": [{}]}, node)  # empty term: nothing
    assert matches_node_selector({"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
        {"matchExpressions": [{"key": "gpu", "operator": "Gt", "values": ["4"]}]}]}, node)
    assert matches_node_selector({"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}, node)
    assert not matches_node_selector({"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}]}, node)
