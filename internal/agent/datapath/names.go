package datapath

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// maxComment is the longest set-element comment the datapath writes, in
// bytes. The kernel bounds an element's userdata (NFTA_SET_ELEM_USERDATA,
// where libnftnl's TLV encoding stores the comment with a NUL) at
// NFT_USERDATA_MAXLEN = 256 bytes (include/uapi/linux/netfilter/
// nf_tables.h), refusing the whole transaction with ERANGE, and it also
// refuses an element whose extensions outgrow their u8 offsets (EINVAL):
// on Linux 6.18 a comment on an element of the ids set fails at 252 and at
// 254 bytes and above. 128 leaves a wide margin under both.
const maxComment = 128

// digestPrefix starts the key under which an Egress whose name does not fit
// an ids-set comment is recorded. '#' cannot occur in a Kubernetes object
// name (a DNS-1123 subdomain), so a key never collides with a name.
const digestPrefix = "#"

// longestRoleWord is the length of the longest roleWord entry.
const longestRoleWord = len("source")

// idKey is the key under which the ids set records an Egress: its name
// when "<role>/<name>" fits maxComment for every role, else digestPrefix
// and the first 128 bits of the name's SHA-256 in hex (33 bytes). The key
// depends on the name only, so a role change keeps it.
func idKey(name string) string {
	if longestRoleWord+1+len(name) <= maxComment {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return digestPrefix + hex.EncodeToString(sum[:16])
}

// idComment is the comment of an Egress's element in the ids set:
// "<role>/<idKey(name)>", at most maxComment bytes.
func idComment(r Role, name string) string {
	return roleWord[r] + "/" + idKey(name)
}

// isDigestKey reports whether k (read back from an ids comment) stands for
// a name too long to be written out.
func isDigestKey(k string) bool { return strings.HasPrefix(k, digestPrefix) }
