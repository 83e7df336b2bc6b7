package console

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/dossier"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// dossierView is one signed authorization a review's approval was used
// for: the review page links to its dossier.
type dossierView struct {
	Nonce, Amount, To string
}

// dossiersOf lists the signed authorizations that used review id's
// approval.
func (c *Console) dossiersOf(ctx context.Context, id string) ([]dossierView, error) {
	all, err := c.cfg.Log.Authorizations(ctx)
	if err != nil {
		return nil, err
	}
	var out []dossierView
	for _, a := range all {
		if a.ReviewID == id {
			out = append(out, dossierView{Nonce: strings.ToLower(a.Nonce), Amount: c.amountOf(a.Authorized), To: a.To})
		}
	}
	return out, nil
}

// dossier serves the dossier of one authorization a review's approval
// was used for, built by package dossier as dossier export builds it, the
// chains' heads signed now with the server's key. Only a reviewer signed
// in to this console (this tenant's) gets it; to anyone else, and for a
// review or authorization this console's log does not hold, the answer is
// the same 404, so the answer tells nothing of another tenant's payments.
func (c *Console) dossier(w http.ResponseWriter, r *http.Request) {
	notFound := func() {
		http.Error(w, "no such dossier", http.StatusNotFound)
	}
	if c.reviewer(r) == "" {
		notFound()
		return
	}
	ctx := r.Context()
	id, nonce := r.PathValue("id"), strings.ToLower(r.PathValue("nonce"))
	rv, _, err := c.cfg.Log.Verified(ctx, id)
	if errors.Is(err, reviewlog.ErrUnknownReview) || errors.Is(err, reviewlog.ErrBadID) {
		notFound()
		return
	}
	if err != nil {
		c.cfg.Logger.Error("console: a review could not be read for its dossier", "review", id, "err", err)
		http.Error(w, "the server could not build this dossier; see its log", http.StatusInternalServerError)
		return
	}
	a, err := dossier.Find(ctx, c.cfg.Log, nonce)
	if errors.Is(err, dossier.ErrNotFound) || (err == nil && (strings.ToLower(a.Nonce) != nonce || a.ReviewID != rv.ID)) {
		notFound()
		return
	}
	if err != nil {
		c.cfg.Logger.Error("console: an authorization could not be read for its dossier", "review", id, "nonce", nonce, "err", err)
		http.Error(w, "the server could not build this dossier; see its log", http.StatusInternalServerError)
		return
	}
	c.serveDossier(w, r, a, "review", id)
}

// findingDossier serves the dossier of an authorization whose settlement
// carries a finding, the one the finding page links to: to a reviewer
// signed in to this console, for a nonce this console's log holds a
// settlement with findings of; to anyone else, or for any other nonce,
// the same 404 as dossier's.
func (c *Console) findingDossier(w http.ResponseWriter, r *http.Request) {
	if c.reviewer(r) == "" {
		http.Error(w, "no such dossier", http.StatusNotFound)
		return
	}
	nonce := strings.ToLower(r.PathValue("nonce"))
	_, a, ok, err := c.findingFor(r.Context(), nonce)
	if err != nil {
		c.cfg.Logger.Error("console: the settlements could not be read for a dossier", "nonce", nonce, "err", err)
		http.Error(w, "the server could not build this dossier; see its log", http.StatusInternalServerError)
		return
	}
	if !ok || strings.ToLower(a.Nonce) != nonce {
		http.Error(w, "no such dossier", http.StatusNotFound)
		return
	}
	c.serveDossier(w, r, a, "finding", nonce)
}

// serveDossier builds a's dossier as dossier export does, the chains'
// heads signed now with the server's key, and sends it as a download;
// from says which page's link it was (review or finding, and its id).
func (c *Console) serveDossier(w http.ResponseWriter, r *http.Request, a reviewlog.AuthorizedLine, from, id string) {
	ctx := r.Context()
	nonce := strings.ToLower(a.Nonce)
	d, err := dossier.Build(ctx, c.cfg.Log, a, dossier.Options{Signer: c.cfg.Decider.Chains.Signer, Now: c.cfg.Now(), PinnedKeys: c.cfg.SellerKeys,
		Warn: func(msg string) {
			c.cfg.Logger.Warn("console: a dossier carries no seller key", "nonce", nonce, "reason", msg)
		}})
	var b []byte
	if err == nil {
		b, err = dossier.Marshal(d)
	}
	if err != nil {
		c.cfg.Logger.Error("console: a dossier could not be built", from, id, "nonce", nonce, "err", err)
		http.Error(w, "the server could not build this dossier; see its log", http.StatusInternalServerError)
		return
	}
	c.cfg.Logger.Info("console: dossier downloaded", from, id, "nonce", nonce, "reviewer", c.reviewer(r))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Disposition", `attachment; filename="dossier-`+nonce+`.json"`)
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}
