// Package guard answers the pre-payment question "should the agent pay this
// counterparty this amount now?" from the policy file and the receipts of
// earlier operations. Decide is a pure function of (request, history,
// policy, clock) so that every entry point — the MCP tool, the CLI, a later
// gateway — gets the very same answer for the same inputs.
//
// Money is never a float here: amounts are parsed once (policy at load,
// request at parse) into integer atomic units of an asset.
package guard
