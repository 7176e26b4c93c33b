package aws

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// impliedActions are the IAM actions an EC2 operation needs besides its
// own: a create call that carries TagSpecifications is also authorised as
// ec2:CreateTags (EC2 User Guide, "Resource-Level Permissions for
// Tagging").
var impliedActions = map[string][]string{
	"CreateNetworkInterface": {"CreateTags"},
}

// stringOrList is an IAM policy element that may be one string or a list.
type stringOrList []string

func (s *stringOrList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*s = many
	return nil
}

type policyStatement struct {
	Sid       string
	Effect    string
	Action    stringOrList
	Resource  stringOrList
	Condition map[string]map[string]string
}

// docPolicy returns the first JSON block after the "## IAM policy"
// heading of docs/cloud-aws.md.
func docPolicy(t *testing.T) []policyStatement {
	t.Helper()
	raw, err := os.ReadFile("../../../docs/cloud-aws.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## IAM policy\n")
	if !ok {
		t.Fatal(`docs/cloud-aws.md has no "## IAM policy" section`)
	}
	_, block, ok := strings.Cut(section, "```json\n")
	if !ok {
		t.Fatal("the IAM policy section has no ```json block")
	}
	block, _, ok = strings.Cut(block, "```")
	if !ok {
		t.Fatal("the IAM policy's json block is not closed")
	}
	var doc struct {
		Version   string
		Statement []policyStatement
	}
	dec := json.NewDecoder(strings.NewReader(block))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("the documented IAM policy is not valid JSON: %v", err)
	}
	if doc.Version != "2012-10-17" {
		t.Errorf("policy Version %q, want 2012-10-17", doc.Version)
	}
	return doc.Statement
}

// TestIAMPolicyCoversProvider checks the IAM policy in docs/cloud-aws.md
// against the EC2 operations the Provider can call (the methods of
// ec2API): each is allowed, nothing else is, only Describe actions use
// Resource "*", and the tag-on-create and ownership conditions are there.
func TestIAMPolicyCoversProvider(t *testing.T) {
	stmts := docPolicy(t)

	want := map[string]bool{}
	api := reflect.TypeFor[ec2API]()
	for m := range api.Methods() {
		name := m.Name
		want["ec2:"+name] = true
		for _, extra := range impliedActions[name] {
			want["ec2:"+extra] = true
		}
	}
	if len(want) < 15 {
		t.Fatalf("ec2API lists %d actions; the reflection found too few", len(want))
	}

	allowed := map[string]bool{}
	for _, s := range stmts {
		if s.Effect != "Allow" {
			t.Errorf("statement %s: Effect %q, want Allow", s.Sid, s.Effect)
		}
		star := slices.Contains(s.Resource, "*")
		for _, a := range s.Action {
			allowed[a] = true
			if !want[a] {
				t.Errorf("statement %s allows %s, which the provider never calls", s.Sid, a)
			}
			if star && !strings.HasPrefix(a, "ec2:Describe") {
				t.Errorf("statement %s allows %s on Resource \"*\"; only Describe actions, which support no resource-level permission, may", s.Sid, a)
			}
			if !star && strings.HasPrefix(a, "ec2:Describe") {
				t.Errorf("statement %s scopes %s to %v; Describe actions support only \"*\"", s.Sid, a, s.Resource)
			}
		}
		if len(s.Resource) == 0 {
			t.Errorf("statement %s has no Resource", s.Sid)
		}
	}
	for a := range want {
		if !allowed[a] {
			t.Errorf("the provider calls %s but the documented policy does not allow it", a)
		}
	}

	// The conditions that make the policy safe: whoever holds the role
	// can create only tagged ENIs, tag only in that create call, and change
	// only ENIs and Elastic IPs tagged with the cluster.
	const cluster = "aws:ResourceTag/egressip.io/cluster"
	for _, s := range stmts {
		eq := s.Condition["StringEquals"]
		onENI := slices.Contains(s.Resource, "arn:aws:ec2:*:*:network-interface/*")
		onEIP := slices.Contains(s.Resource, "arn:aws:ec2:*:*:elastic-ip/*")
		for _, a := range s.Action {
			switch {
			case a == "ec2:CreateTags":
				if eq["ec2:CreateAction"] != "CreateNetworkInterface" {
					t.Errorf("statement %s: ec2:CreateTags without ec2:CreateAction = CreateNetworkInterface", s.Sid)
				}
			case a == "ec2:CreateNetworkInterface" && onENI:
				if eq["aws:RequestTag/egressip.io/cluster"] == "" || eq["aws:RequestTag/node.k8s.amazonaws.com/no_manage"] != "true" {
					t.Errorf("statement %s: CreateNetworkInterface on network-interface/* without the cluster and no_manage request tags: %v", s.Sid, eq)
				}
			case onENI || onEIP:
				if eq[cluster] == "" {
					t.Errorf("statement %s: %s on %v without %s", s.Sid, a, s.Resource, cluster)
				}
			}
		}
	}
}
