// Package policy evaluates custom guard rules written in the open
// noa.policy/0.2 format: an ordered list of rules whose conditions compare a
// flat snapshot of scalars (strings, booleans, safe integers).
//
// The package follows the NOA policy specification (docs/policy-spec.md of
// NordenSoft/noa) and, where the specification leaves room, the behaviour its
// conformance vectors pin:
//
//   - Documents (policies and input snapshots) are strict JSON as internal/jcs
//     parses it: duplicate keys, the keys __proto__/prototype/constructor,
//     fractions, exponents, integers beyond ±(2^53-1), unpaired surrogates,
//     invalid UTF-8 and nesting deeper than MaxDepth are refused.
//   - The grammar is closed: a key the specification does not name is an
//     error, never ignored.
//   - Strings are ordered by UTF-16 code units (JavaScript's <), which is what
//     the reference evaluator does and what the vectors pin; the prose of the
//     specification says code points, and its own finding F5 records the
//     difference.
//   - requiredPaths members must be non-empty strings, as the reference
//     validator requires (the prose says only "strings").
//   - Every failure denies. Evaluation returns the verdict, the ruleFired
//     value of the specification (part of the conformance contract) and the
//     step of §4 that decided, so that a caller can tell a rule whose id
//     happens to be "eval-error" from the evaluator's own error.
package policy
