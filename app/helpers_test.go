package app_test

import "github.com/haia-trace-mcp/haia-trace-mcp/app/catalog"

func catalogQuery() catalog.ListQuery { return catalog.ListQuery{Limit: 50} }
