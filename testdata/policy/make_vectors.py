#!/usr/bin/env python3
"""Writes this project's own noa.policy/0.2 vectors (validity.json, evaluation.json).

The verdicts and ruleFired values below are written by hand from the specification
(docs/policy-spec.md of NordenSoft/noa, sections 2-5); they are not produced by the Go
evaluator. The hashes are computed here, independently of the Go code, with Python's json
module and an explicit RFC 8785 key order (UTF-16 code units), so the Go test compares two
independent implementations of policyHash, readSetHash and inputsHash.

Run from the repository root:  python3 testdata/policy/make_vectors.py
"""
import hashlib
import json
import os

SPEC = "noa.policy/0.2"
HERE = os.path.dirname(os.path.abspath(__file__))


def utf16_key(s):
    return s.encode("utf-16-be")


def canon(v):
    """RFC 8785 for the subset NOA allows: objects, arrays, strings, safe ints, bools."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        assert abs(v) <= 2**53 - 1
        return str(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ",".join(canon(x) for x in v) + "]"
    if isinstance(v, dict):
        keys = sorted(v, key=utf16_key)
        return "{" + ",".join(canon(k) + ":" + canon(v[k]) for k in keys) + "}"
    raise TypeError(type(v))


def h(v):
    return "sha256:" + hashlib.sha256(canon(v).encode("utf-8")).hexdigest()


def read_set(p):
    s = set(p.get("requiredPaths", []) if isinstance(p.get("requiredPaths"), list) else [])

    def walk(c):
        if not isinstance(c, dict):
            return
        if "clauses" in c:
            for x in c["clauses"] if isinstance(c["clauses"], list) else []:
                walk(x)
        elif "clause" in c:
            walk(c["clause"])
        elif isinstance(c.get("path"), str):
            s.add(c["path"])

    for r in p.get("rules", []) if isinstance(p.get("rules"), list) else []:
        if isinstance(r, dict) and "when" in r:
            walk(r["when"])
    return sorted(s, key=utf16_key)


def pol(pid, rules, required=()):
    return {"spec": SPEC, "id": pid, "requiredPaths": list(required), "rules": rules}


def rule(rid, when, then="ALLOW"):
    return {"id": rid, "when": when, "then": then}


def cmp(op, path, value):
    return {"op": op, "path": path, "value": value}


def case(name, inputs, verdict, fired, step, inputs_hash=False, text=None):
    c = {"name": name}
    if text is not None:
        c["inputsText"] = text
    else:
        c["inputs"] = inputs
    c.update({"verdict": verdict, "ruleFired": fired, "step": step})
    if inputs_hash:
        c["inputsHash"] = h(inputs)
    return c


def valid(name, p, cases, pin_read_set=False):
    e = {"name": name, "policy": p, "policyHash": h(p), "readSetHash": h(read_set(p))}
    if pin_read_set:
        e["readSet"] = read_set(p)
    e["cases"] = cases
    return e


def invalid(name, p, errors, step=3, extra_cases=()):
    """A policy that breaks a validity rule: no hash, DENY policy-invalid."""
    e = {"name": name}
    if isinstance(p, str):
        e["policyText"] = p
    else:
        e["policy"] = p
    e["policyHash"] = None
    e["readSetHash"] = None
    e["parseError"] = errors
    e["cases"] = [case("denies-policy-invalid", {"x": 1}, "DENY", "policy-invalid", step)] + list(extra_cases)
    return e


def nots(n, leaf):
    c = leaf
    for _ in range(n):
        c = {"op": "not", "clause": c}
    return c


OK = rule("r", cmp("eq", "x", 1))


def validity():
    v = []
    # Step 1: the bytes are not a strict JSON document.
    for name, text, why in [
        ("syntax-not-json", "{", "at byte 1"),
        ("syntax-trailing-bytes", json.dumps(pol("p", [OK])) + " x", "trailing"),
        ("syntax-bom", "\ufeff" + json.dumps(pol("p", [OK])), "unexpected character"),
        ("syntax-duplicate-key", '{"spec":"noa.policy/0.2","id":"a","id":"b","requiredPaths":[],"rules":[]}', "duplicate object key"),
        ("syntax-fraction", '{"spec":"noa.policy/0.2","id":"p","requiredPaths":[],"rules":[{"id":"r","when":{"op":"eq","path":"x","value":1.5},"then":"ALLOW"}]}', "non-integer"),
        ("syntax-integral-float", '{"spec":"noa.policy/0.2","id":"p","requiredPaths":[],"rules":[{"id":"r","when":{"op":"eq","path":"x","value":1.0},"then":"ALLOW"}]}', "non-integer"),
        ("syntax-exponent", '{"spec":"noa.policy/0.2","id":"p","requiredPaths":[],"rules":[{"id":"r","when":{"op":"eq","path":"x","value":1e3},"then":"ALLOW"}]}', "non-integer"),
        ("syntax-unsafe-integer", '{"spec":"noa.policy/0.2","id":"p","requiredPaths":[],"rules":[{"id":"r","when":{"op":"eq","path":"x","value":9007199254740992},"then":"ALLOW"}]}', "safe range"),
        ("syntax-lone-surrogate", '{"spec":"noa.policy/0.2","id":"p","requiredPaths":[],"rules":[{"id":"r","when":{"op":"eq","path":"x","value":"\\ud800"},"then":"ALLOW"}]}', "unpaired surrogate"),
        ("syntax-forbidden-key", '{"spec":"noa.policy/0.2","id":"p","requiredPaths":[],"rules":[{"id":"r","when":{"op":"exists","path":"x","constructor":1},"then":"ALLOW"}]}', "forbidden object key"),
    ]:
        v.append(invalid(name, text, [why], step=1))
    # An unparseable policy is reported before an unparseable input (step 1 before 2).
    v.append(invalid("syntax-before-input-syntax", "[", [], step=1, extra_cases=[
        case("bad-input-too", None, "DENY", "policy-invalid", 1, text="{")]))
    # An unparseable input is reported before an invalid policy (step 2 before 3).
    v.append(invalid("grammar-after-input-syntax", pol("", [OK]), ["$.id"], extra_cases=[
        case("bad-input-first", None, "DENY", "eval-error", 2, text="{")]))
    # An invalid policy is reported before a non-map input (step 3 before 4).
    v.append(invalid("grammar-before-input-shape", pol("", [OK]), ["$.id"], extra_cases=[
        case("null-input", None, "DENY", "policy-invalid", 3, text="null")]))
    # §2.8 depth bound: 60 nested `not`s put the leaf's members at level 64 (accepted),
    # 61 put them at level 65 (refused) — MaxDepth = 64 counted over every object and array.
    p60 = pol("depth-60", [rule("deep", nots(60, cmp("eq", "x", 1)))], ["x"])
    v.append(valid("depth-60-accepted", p60, [case("evaluates", {"x": 1}, "ALLOW", "deep", 7)]))
    p61 = pol("depth-61", [rule("deep", nots(61, cmp("eq", "x", 1)))], ["x"])
    e = invalid("depth-61-refused", p61, ["nesting deeper than 64"], step=1)
    e["readSetHash"] = h(read_set(p61))
    v.append(e)
    # A deep input document is refused like a deep policy (step 2).
    deep_input = '{"x":' + "[" * 65 + "]" * 65 + "}"
    v.append(valid("depth-input", pol("p", [OK]), [
        case("input-65-levels", None, "DENY", "eval-error", 2, text=deep_input)]))
    # §2 the policy is an object.
    v.append(invalid("policy-not-object", [], ["$:", "must be a JSON object"]))
    # §2.1 spec.
    v.append(invalid("spec-wrong", dict(pol("p", [OK]), spec="noa.policy/0.1"), ["$.spec", "§2.1"]))
    v.append(invalid("spec-missing", {"id": "p", "requiredPaths": [], "rules": [OK]}, ["$.spec", "§2.1"]))
    # §2.2 id.
    v.append(invalid("id-empty", pol("", [OK]), ["$.id", "§2.2"]))
    v.append(invalid("id-number", dict(pol("p", [OK]), id=7), ["$.id", "§2.2"]))
    # §2.3 requiredPaths.
    v.append(invalid("requiredPaths-string", dict(pol("p", [OK]), requiredPaths="ab"), ["$.requiredPaths", "§2.3"]))
    v.append(invalid("requiredPaths-missing", {"spec": SPEC, "id": "p", "rules": [OK]}, ["$.requiredPaths", "§2.3"]))
    v.append(invalid("requiredPaths-member-number", pol("p", [OK], ["a", 1]), ["$.requiredPaths[1]", "§2.3"]))
    v.append(invalid("requiredPaths-member-empty", pol("p", [OK], [""]), ["$.requiredPaths[0]", "§2.3"]))
    # §2.4 rules.
    v.append(invalid("rules-object", dict(pol("p", []), rules={}), ["$.rules", "§2.4"]))
    v.append(invalid("rules-missing", {"spec": SPEC, "id": "p", "requiredPaths": []}, ["$.rules", "§2.4"]))
    v.append(invalid("rule-not-object", pol("p", ["r"]), ["$.rules[0]", "§2.4"]))
    v.append(invalid("rule-id-empty", pol("p", [rule("", cmp("eq", "x", 1))]), ["$.rules[0].id", "§2.4"]))
    v.append(invalid("rule-id-missing", pol("p", [{"when": cmp("eq", "x", 1), "then": "ALLOW"}]), ["$.rules[0].id"]))
    v.append(invalid("rule-when-missing", pol("p", [{"id": "r", "then": "ALLOW"}]), ["$.rules[0].when", "§2.6"]))
    # §2.5 then.
    v.append(invalid("then-lowercase", pol("p", [rule("r", cmp("eq", "x", 1), "allow")]), ["$.rules[0].then", "§2.5"]))
    v.append(invalid("then-missing", pol("p", [{"id": "r", "when": cmp("eq", "x", 1)}]), ["$.rules[0].then", "§2.5"]))
    # §2.6 op and its members.
    v.append(invalid("op-unknown", pol("p", [rule("r", cmp("regex", "x", "a.*"))]), ["$.rules[0].when.op", "unknown operator"]))
    v.append(invalid("op-missing", pol("p", [rule("r", {"path": "x", "value": 1})]), ["$.rules[0].when.op", "§2.6"]))
    v.append(invalid("op-number", pol("p", [rule("r", {"op": 1, "path": "x"})]), ["$.rules[0].when.op"]))
    v.append(invalid("op-case", pol("p", [rule("r", cmp("EQ", "x", 1))]), ["unknown operator \"EQ\""]))
    v.append(invalid("condition-array", pol("p", [rule("r", [cmp("eq", "x", 1)])]), ["$.rules[0].when", "condition object"]))
    v.append(invalid("not-without-clause", pol("p", [rule("r", {"op": "not"})]), ["$.rules[0].when.clause"]))
    v.append(invalid("not-with-clauses", pol("p", [rule("r", {"op": "not", "clauses": [cmp("eq", "x", 1)]})]), ["unknown key \"clauses\""]))
    v.append(invalid("eq-without-value", pol("p", [rule("r", {"op": "eq", "path": "x"})]), ["$.rules[0].when.value", "§2.12"]))
    v.append(invalid("exists-with-value", pol("p", [rule("r", {"op": "exists", "path": "x", "value": 1})]), ["unknown key \"value\"", "§2.7"]))
    v.append(invalid("in-with-value", pol("p", [rule("r", {"op": "in", "path": "x", "value": 1, "values": [1]})]), ["unknown key \"value\""]))
    # §2.7 closed grammar at every level.
    v.append(invalid("unknown-key-policy", dict(pol("p", [OK]), description="x"), ["$: unknown key \"description\""]))
    v.append(invalid("unknown-key-rule", pol("p", [dict(OK, priority=1)]), ["$.rules[0]: unknown key \"priority\""]))
    v.append(invalid("unknown-key-condition", pol("p", [rule("r", dict(cmp("eq", "x", 1), comment="c"))]), ["$.rules[0].when: unknown key \"comment\""]))
    v.append(invalid("unknown-key-nested-and", pol("p", [rule("r", {"op": "and", "clauses": [cmp("eq", "x", 1), {"op": "exists", "path": "y", "note": 1}]})]), ["$.rules[0].when.clauses[1]: unknown key \"note\""]))
    v.append(invalid("unknown-key-under-not", pol("p", [rule("r", nots(3, {"op": "absent", "path": "y", "extra": True}))]), ["$.rules[0].when.clause.clause.clause: unknown key \"extra\""]))
    v.append(invalid("unknown-key-and-node", pol("p", [rule("r", {"op": "or", "clauses": [cmp("eq", "x", 1)], "clause": cmp("eq", "x", 1)})]), ["unknown key \"clause\""]))
    # §2.9 clauses.
    v.append(invalid("and-empty", pol("p", [rule("r", {"op": "and", "clauses": []})]), ["$.rules[0].when.clauses", "§2.9"]))
    v.append(invalid("or-empty", pol("p", [rule("r", {"op": "or", "clauses": []})]), ["$.rules[0].when.clauses", "§2.9"]))
    v.append(invalid("and-clauses-object", pol("p", [rule("r", {"op": "and", "clauses": cmp("eq", "x", 1)})]), ["§2.9"]))
    v.append(invalid("or-clause-not-object", pol("p", [rule("r", {"op": "or", "clauses": [cmp("eq", "x", 1), "x"]})]), ["$.rules[0].when.clauses[1]"]))
    # §2.10 path.
    for op, extra in [("exists", {}), ("absent", {}), ("in", {"values": [1]}), ("eq", {"value": 1}), ("ne", {"value": 1}), ("ge", {"value": 1})]:
        v.append(invalid("path-empty-" + op, pol("p", [rule("r", dict({"op": op, "path": ""}, **extra))]), ["$.rules[0].when.path", "§2.10"]))
    v.append(invalid("path-missing", pol("p", [rule("r", {"op": "lt", "value": 1})]), ["$.rules[0].when.path", "§2.10"]))
    v.append(invalid("path-number", pol("p", [rule("r", {"op": "exists", "path": 1})]), ["$.rules[0].when.path"]))
    # §2.11 values.
    v.append(invalid("in-values-empty", pol("p", [rule("r", {"op": "in", "path": "x", "values": []})]), ["$.rules[0].when.values", "§2.11"]))
    v.append(invalid("in-values-scalar", pol("p", [rule("r", {"op": "in", "path": "x", "values": 1})]), ["$.rules[0].when.values", "§2.11"]))
    v.append(invalid("in-values-null-member", pol("p", [rule("r", {"op": "in", "path": "x", "values": [1, None]})]), ["$.rules[0].when.values[1]", "§2.11"]))
    v.append(invalid("in-values-object-member", pol("p", [rule("r", {"op": "in", "path": "x", "values": [1, {}]})]), ["$.rules[0].when.values[1]"]))
    v.append(invalid("in-values-mixed", pol("p", [rule("r", {"op": "in", "path": "x", "values": [1, "1"]})]), ["$.rules[0].when.values[1]", "mixed scalar types"]))
    v.append(invalid("in-values-mixed-bool", pol("p", [rule("r", {"op": "in", "path": "x", "values": [True, 1]})]), ["mixed scalar types"]))
    # §2.12 value.
    for name, val in [("null", None), ("array", [1]), ("object", {"a": 1})]:
        v.append(invalid("value-" + name, pol("p", [rule("r", cmp("eq", "x", val))]), ["$.rules[0].when.value", "§2.12"]))
    # §2.13 unique rule ids.
    v.append(invalid("rule-ids-duplicate", pol("p", [rule("r", cmp("eq", "x", 1)), rule("s", cmp("eq", "x", 2)), rule("r", cmp("eq", "x", 3), "DENY")]), ["$.rules[2].id", "duplicate rule id \"r\""]))
    # Several problems are all reported.
    v.append(invalid("several-problems", {"spec": "x", "id": "", "requiredPaths": [], "rules": [rule("r", {"op": "and", "clauses": []}, "MAYBE")]}, ["$.spec", "$.id", "$.rules[0].then", "$.rules[0].when.clauses"]))
    return v


def evaluation():
    v = []
    # Key order and whitespace do not change the identity; the read set is deduplicated
    # and sorted by UTF-16 code units (é U+00E9 < 😀 U+1F600 (D83D..) < U+FFFF).
    rs_rules = [
        rule("r1", {"op": "and", "clauses": [cmp("eq", "b", 1), {"op": "exists", "path": "c"}, {"op": "not", "clause": cmp("eq", "a", 2)}]}),
        rule("r2", {"op": "or", "clauses": [{"op": "in", "path": "😀", "values": ["x"]}, cmp("lt", "\uffff", "z"), {"op": "absent", "path": "B"}, cmp("gt", "é", "e")]}),
    ]
    p = pol("read-set", rs_rules, ["b", "a", "b"])
    v.append(valid("read-set-dedup-sort", p, [
        case("r2-via-absent-B", {"a": 1, "b": 2}, "ALLOW", "r2", 7, inputs_hash=True),
    ], pin_read_set=True))
    # The same policy with members in another order hashes the same.
    p_reordered = {"rules": [{"then": r["then"], "when": r["when"], "id": r["id"]} for r in rs_rules], "requiredPaths": ["b", "a", "b"], "id": "read-set", "spec": SPEC}
    v.append(valid("read-set-key-order-irrelevant", p_reordered, [], pin_read_set=True))
    # Steps 2, 4, 5, 6 with one policy.
    p = pol("steps", [rule("deny-big", cmp("gt", "amount", 100), "DENY"), rule("allow-rest", {"op": "exists", "path": "amount"})], ["who", "amount"])
    v.append(valid("evaluation-steps", p, [
        case("step2-input-not-json", None, "DENY", "eval-error", 2, text="{\"who\":"),
        case("step2-input-duplicate-key", None, "DENY", "eval-error", 2, text='{"who":"a","amount":1,"amount":2}'),
        case("step2-input-float", None, "DENY", "eval-error", 2, text='{"who":"a","amount":1.5}'),
        case("step2-input-forbidden-key", None, "DENY", "eval-error", 2, text='{"who":"a","amount":1,"__proto__":1}'),
        case("step2-input-unsafe-int", None, "DENY", "eval-error", 2, text='{"who":"a","amount":-9007199254740992}'),
        case("step4-input-null", None, "DENY", "input-invalid", 4, text="null"),
        case("step4-input-array", None, "DENY", "input-invalid", 4, text='[{"who":"a","amount":1}]'),
        case("step4-input-string", None, "DENY", "input-invalid", 4, text='"who"'),
        case("step5-first-required-in-order", {}, "DENY", "required-input-absent:who", 5),
        case("step5-second-required", {"who": "a"}, "DENY", "required-input-absent:amount", 5),
        case("step5-before-step6", {"amount": 1, "junk": None}, "DENY", "required-input-absent:who", 5),
        case("step5-null-is-present", {"who": None, "amount": 1}, "DENY", "eval-error", 6),
        case("step6-unread-null", {"who": "a", "amount": 1, "junk": None}, "DENY", "eval-error", 6),
        case("step6-unread-array", {"who": "a", "amount": 1, "junk": [1]}, "DENY", "eval-error", 6),
        case("step6-unread-object", {"who": "a", "amount": 1, "junk": {}}, "DENY", "eval-error", 6),
        case("step7-deny-rule", {"who": "a", "amount": 101}, "DENY", "deny-big", 7, inputs_hash=True),
        case("step7-allow-rule", {"who": "a", "amount": 100}, "ALLOW", "allow-rest", 7, inputs_hash=True),
        case("step9-type-mismatch", {"who": "a", "amount": "101"}, "DENY", "eval-error", 9),
        case("step9-bool-vs-int", {"who": "a", "amount": True}, "DENY", "eval-error", 9),
    ]))
    # Step 8: nothing matched; an empty rule list always ends there.
    v.append(valid("no-rules", pol("empty", []), [
        case("default-deny", {}, "DENY", None, 8),
        case("default-deny-with-inputs", {"x": 1}, "DENY", None, 8),
    ]))
    # Step 7: the first matching rule wins, later matches and later errors are never reached.
    p = pol("first-wins", [rule("first", cmp("ge", "n", 1)), rule("second", cmp("ge", "n", 0), "DENY"), rule("broken", cmp("eq", "n", "x"))])
    v.append(valid("first-match-wins", p, [
        case("both-match", {"n": 5}, "ALLOW", "first", 7),
        case("second-only", {"n": 0}, "DENY", "second", 7),
        case("reaches-broken", {"n": -1}, "DENY", "eval-error", 9),
        case("absent-never-errors", {}, "DENY", None, 8),
    ]))
    # Short-circuit: an error in a clause that is not reached is no error.
    p = pol("short-circuit", [
        rule("and-first-false", {"op": "and", "clauses": [cmp("eq", "a", 2), cmp("eq", "b", "x")]}, "DENY"),
        rule("or-first-true", {"op": "or", "clauses": [cmp("eq", "a", 1), cmp("eq", "b", "x")]}),
    ])
    v.append(valid("short-circuit", p, [
        case("and-stops-at-false-or-stops-at-true", {"a": 1, "b": 5}, "ALLOW", "or-first-true", 7),
        case("and-reaches-mismatch", {"a": 2, "b": 5}, "DENY", "eval-error", 9),
        case("or-reaches-mismatch", {"a": 3, "b": 5}, "DENY", "eval-error", 9),
        case("absent-b-no-error", {"a": 3}, "DENY", None, 8),
    ]))
    # Absence makes every comparison false, ne included; in too.
    rules = [rule("c-" + op, {"op": "not", "clause": cmp(op, "missing", 1)}, "DENY") for op in ["eq", "ne", "lt", "le", "gt", "ge"]]
    v.append(valid("absent-comparisons-are-false", pol("absent-ops", [rule("ne-absent", cmp("ne", "missing", 1))] + [rule("in-absent", {"op": "in", "path": "missing", "values": [1]})] + [rule("absent", {"op": "absent", "path": "missing"})]), [
        case("absent-falls-to-absent-op", {"other": 1}, "ALLOW", "absent", 7),
        case("present-ne", {"missing": 2}, "ALLOW", "ne-absent", 7),
        case("present-in", {"missing": 1}, "ALLOW", "in-absent", 7),
    ]))
    v.append(valid("not-of-absent-comparison", pol("not-absent", rules), [
        case("not-eq-absent-is-true", {}, "DENY", "c-eq", 7),
    ]))
    # Every comparison operator on integers, booleans and strings.
    ops = [("eq", 10), ("ne", 10), ("lt", 10), ("le", 10), ("gt", 10), ("ge", 10)]
    for kind, pivot, lo, hi in [("int", 10, -3, 2**53 - 1), ("bool", True, False, True), ("string", "m", "a", "z")]:
        for op, _ in ops:
            p = pol(f"{kind}-{op}", [rule(op, cmp(op, "v", pivot))])
            expect = {
                "eq": (False, True, False), "ne": (True, False, True), "lt": (True, False, False),
                "le": (True, True, False), "gt": (False, False, True), "ge": (False, True, True),
            }[op]
            if kind == "bool":
                vals = (lo, pivot)
                expect = expect[:2]
            else:
                vals = (lo, pivot, hi)
            cs = []
            for val, want in zip(vals, expect):
                cs.append(case(f"{op}-{json.dumps(val, ensure_ascii=True)}", {"v": val}, "ALLOW" if want else "DENY", op if want else None, 7 if want else 8))
            v.append(valid(f"op-{kind}-{op}", p, cs))
    # Strings: a proper prefix sorts first; no case folding; UTF-16 order for astral vs BMP.
    p = pol("strings", [rule("lt-ab", cmp("lt", "s", "ab"))])
    v.append(valid("string-order", p, [
        case("prefix-first", {"s": "a"}, "ALLOW", "lt-ab", 7),
        case("empty-first", {"s": ""}, "ALLOW", "lt-ab", 7),
        case("upper-before-lower", {"s": "B"}, "ALLOW", "lt-ab", 7),
        case("extension-after", {"s": "abc"}, "DENY", None, 8),
        case("astral-above-ascii", {"s": "😀"}, "DENY", None, 8),
    ]))
    p = pol("astral", [rule("astral-below-fffd", cmp("lt", "s", "\ufffd"))])
    v.append(valid("astral-below-bmp-top", p, [
        case("emoji-sorts-below-fffd", {"s": "😀"}, "ALLOW", "astral-below-fffd", 7),
        case("e000-is-below-fffd", {"s": "\ue000"}, "ALLOW", "astral-below-fffd", 7),
    ]))
    # in over integers, booleans, strings; type mismatch in `in` is an error.
    p = pol("in", [rule("in-int", {"op": "in", "path": "n", "values": [1, 2, -9007199254740991]}),
                   rule("in-bool", {"op": "in", "path": "b", "values": [False]}),
                   rule("in-str", {"op": "in", "path": "s", "values": ["a", "é"]})])
    v.append(valid("in-membership", p, [
        case("int-member", {"n": -9007199254740991}, "ALLOW", "in-int", 7),
        case("bool-member", {"n": 3, "b": False}, "ALLOW", "in-bool", 7),
        case("str-member-nfc", {"s": "é"}, "ALLOW", "in-str", 7),
        case("str-nfd-is-other-string", {"s": "e\u0301"}, "DENY", None, 8),
        case("in-type-mismatch", {"n": "1"}, "DENY", "eval-error", 9),
    ]))
    # exists/absent, not; keys are opaque (no dotted traversal).
    p = pol("keys", [rule("dotted", cmp("eq", "a.b", 1)), rule("no-a", {"op": "not", "clause": {"op": "exists", "path": "a"}}, "DENY")])
    v.append(valid("opaque-keys", p, [
        case("dotted-key-matches", {"a.b": 1}, "ALLOW", "dotted", 7, inputs_hash=True),
        case("nested-is-not-a-path", {"a": {"b": 1}}, "DENY", "eval-error", 6),
        case("not-exists", {"b": 1}, "DENY", "no-a", 7),
        case("exists-a", {"a": 1}, "DENY", None, 8),
    ]))
    # Integer edges: the safe range, negative zero.
    p = pol("ints", [rule("max", cmp("eq", "n", 2**53 - 1)), rule("min", cmp("le", "n", -(2**53 - 1))), rule("zero", cmp("eq", "n", 0))])
    v.append(valid("integer-edges", p, [
        case("max-safe", {"n": 2**53 - 1}, "ALLOW", "max", 7),
        case("min-safe", {"n": -(2**53 - 1)}, "ALLOW", "min", 7),
        case("negative-zero-is-zero", None, "ALLOW", "zero", 7, text='{"n":-0}'),
    ]))
    # A guard-shaped policy, as an operator would write one.
    p = pol("haia-guard-example", [
        rule("block-testnet-above-050", {"op": "and", "clauses": [cmp("eq", "args.asset", "eip155:84532/0x036cbd53842c5426634e7929541ec2318f3dcf7e"), cmp("gt", "amountAtomic", 500000)]}, "DENY"),
        rule("block-new-counterparty-above-2", {"op": "and", "clauses": [cmp("eq", "history.settled", 0), cmp("gt", "amountAtomic", 2000000)]}, "DENY"),
        rule("allow-rest", {"op": "exists", "path": "amountAtomic"}),
    ], ["args.counterparty", "amountAtomic"])
    v.append(valid("guard-example", p, [
        case("testnet-small", {"args.counterparty": "0xabc", "args.asset": "eip155:84532/0x036cbd53842c5426634e7929541ec2318f3dcf7e", "amountAtomic": 400000, "history.settled": 0}, "ALLOW", "allow-rest", 7, inputs_hash=True),
        case("testnet-large", {"args.counterparty": "0xabc", "args.asset": "eip155:84532/0x036cbd53842c5426634e7929541ec2318f3dcf7e", "amountAtomic": 600000, "history.settled": 3}, "DENY", "block-testnet-above-050", 7, inputs_hash=True),
        case("new-counterparty-large", {"args.counterparty": "0xabc", "amountAtomic": 2500000, "history.settled": 0}, "DENY", "block-new-counterparty-above-2", 7),
        case("no-amount", {"args.counterparty": "0xabc"}, "DENY", "required-input-absent:amountAtomic", 5),
    ]))
    return v


def write(name, note, policies):
    doc = {"spec": "noa.l2-conformance/0.2", "engine": "haia-trace-mcp own vectors",
           "note": note, "policies": policies}
    with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")


write("validity.json", "One or more vectors per validity rule of noa.policy/0.2 §2 and per parse failure (§4 step 1); "
      "policyHash null marks a policy that must be refused; parseError lists substrings the error must name (JSON path, rule).",
      validity())
write("evaluation.json", "One or more vectors per evaluation step of noa.policy/0.2 §4 (the step member is the row), "
      "per operator and scalar type, and for the read set (§5.2). Hashes computed by this script, independently of the Go code.",
      evaluation())
