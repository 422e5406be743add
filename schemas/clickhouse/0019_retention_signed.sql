-- weft_audit_retention's `pruned_before` tells verify which missing sealed facts retention
-- removed. Unsigned, a row forged with a value a day or more old made deletions of older
-- facts count as `pruned`. Now `weft audit retention apply --sign-key` signs what it records
-- (ed25519 over the JCS of {purpose, tenant, pruned_before}, the sealer's key), and
-- `retention set` / `hold` copy the signature forward with the value. `verify --keyring`
-- uses only a value whose signature verifies. Rows written before this migration have
-- empty `kid` and `sig`: unsigned, reported, not used, until the next signed apply.
ALTER TABLE weft_audit_retention
    ADD COLUMN IF NOT EXISTS kid String DEFAULT '',
    ADD COLUMN IF NOT EXISTS sig String DEFAULT '';
