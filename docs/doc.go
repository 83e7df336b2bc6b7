// Package docs holds the project's documentation pages (the Markdown files
// beside this one). It has no code of its own: its tests check that every
// relative link and #anchor in the README, SECURITY.md, CHANGELOG.md and
// these pages resolves, and that every page opens with a table of contents.
package docs
