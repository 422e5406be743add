-- weft_links_from (0008) was a copy of every link, kept by a materialized view. The loader
-- follows a stored node's own links only when the node has no request id (a node with one is
-- its own anchor), so the projector now writes the links of such events there itself, and
-- the view, which copied every link, goes. Rows already copied stay (a superset: harmless).
DROP VIEW IF EXISTS weft_links_from_mv;
