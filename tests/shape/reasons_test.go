package shape

import (
	"fmt"
	"go/ast"
	"go/token"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// The reasons check: the kubelet's words are spelled in pkg/podstate only.

// kubeletReasons are the kubelet's and the scheduler's words for a container's or a pod's
// state (and the events podstate reads) that mean nothing else: a string literal equal to
// one of them, anywhere in product code outside pkg/podstate, spells the kubelet's word
// again. pkg/podstate/reasons.go has most of them; the rest are their neighbours in the
// kubelet, so that a new use of one of those lands in podstate too.
var kubeletReasons = setOf(
	// Why a container waits.
	"ContainerCreating", "PodInitializing", "ErrImagePull", "ImagePullBackOff", "InvalidImageName",
	"ErrImageNeverPull", "CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff",
	"RunContainerError", "PreStartHookError", "PostStartHookError", "ImageInspectError",
	// How a container ended.
	"OOMKilled", "ContainerStatusUnknown", "ContainerCannotRun", "StartError",
	// Why a pod ended or was refused.
	"Evicted", "DeadlineExceeded", "NodeLost", "NodeShutdown", "UnexpectedAdmissionError", "Preempting",
	// The scheduler's PodScheduled reasons and the DisruptionTarget reasons.
	"Unschedulable", "SchedulingGated", "PreemptionByScheduler", "EvictionByEvictionAPI",
	"DeletionByTaintManager", "DeletionByPodGC", "TerminationByKubelet",
	// The kubelet's event reasons podstate reads.
	"FailedMount", "FailedAttachVolume", "FailedMapVolume", "FailedCreatePodSandBox", "InspectFailed",
)

// genericReasons are kubelet reasons that are also plain words ("Error", "Failed" is also
// a BuildJob phase): a literal equal to one is the kubelet's word only where it is a reason,
// that is compared with, switched on, assigned or keyed as something named *reason*.
var genericReasons = setOf("Error", "Completed", "Terminated", "Shutdown", "Failed", "BackOff", "Pulling", "Pulled")

func setOf(words ...string) map[string]bool {
	m := make(map[string]bool, len(words))
	for _, w := range words {
		m[w] = true
	}
	return m
}

// checkReasons reports each string literal outside pkg/podstate that spells a kubelet
// reason. Only literals count: corev1's constants (corev1.PodReasonUnschedulable) are
// spelled by Kubernetes, once.
//
// The API package's Reason constants are exempt where they are declared. Some of them are
// the kubelet's words (ReasonOOMKilled = "OOMKilled", ReasonEvicted = "Evicted"), but they
// are the operator's: the reasons of a BuildJob's conditions, which users and their alerts
// match on. Deriving them from podstate would let a kubelet that renames its reason rename
// the operator's API too, so they stay literals of their own, and only there: anything
// else in the API package that spells a kubelet word is reported like anywhere else.
func checkReasons(s sourceFile) []finding {
	dir := path.Dir(s.rel)
	if dir == podstateDir {
		return nil
	}
	exempt := map[*ast.BasicLit]bool{}
	if dir == apiDir {
		exempt = apiReasonConstants(s.file)
	}
	inReason := reasonContextLiterals(s.file)
	var found []finding
	ast.Inspect(s.file, func(n ast.Node) bool {
		lit, ok := n.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING || exempt[lit] {
			return true
		}
		word, err := strconv.Unquote(lit.Value)
		if err != nil || !(kubeletReasons[word] || genericReasons[word] && inReason[lit]) {
			return true
		}
		found = append(found, finding{s.rel, s.line(lit), fmt.Sprintf(
			"%q is the kubelet's reason, spelled outside %s: use the podstate constant or verdict for it (add one to %s/reasons.go if it has none); if it is the operator's own word, declare it as a Reason constant in %s",
			word, podstateDir, podstateDir, apiDir)})
		return true
	})
	return found
}

// apiReasonConstants are the string literals that give the API package's Reason*
// constants their values.
func apiReasonConstants(f *ast.File) map[*ast.BasicLit]bool {
	lits := map[*ast.BasicLit]bool{}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i >= len(vs.Values) || !strings.HasPrefix(name.Name, "Reason") {
					continue
				}
				if lit, ok := ast.Unparen(vs.Values[i]).(*ast.BasicLit); ok {
					lits[lit] = true
				}
			}
		}
	}
	return lits
}

// reasonContextLiterals are the string literals compared with (== or !=), switched on,
// assigned to or keyed as something whose name says reason: x.Reason == "Error",
// case "Completed" in switch state.Reason, Reason: "Error", reason := "Error".
func reasonContextLiterals(f *ast.File) map[*ast.BasicLit]bool {
	lits := map[*ast.BasicLit]bool{}
	mark := func(e ast.Expr) {
		if lit, ok := ast.Unparen(e).(*ast.BasicLit); ok && lit.Kind == token.STRING {
			lits[lit] = true
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.BinaryExpr:
			if x.Op == token.EQL || x.Op == token.NEQ {
				if namesReason(x.X) {
					mark(x.Y)
				}
				if namesReason(x.Y) {
					mark(x.X)
				}
			}
		case *ast.SwitchStmt:
			if x.Tag != nil && namesReason(x.Tag) {
				for _, stmt := range x.Body.List {
					for _, e := range stmt.(*ast.CaseClause).List {
						mark(e)
					}
				}
			}
		case *ast.AssignStmt:
			for i, lhs := range x.Lhs {
				if i < len(x.Rhs) && namesReason(lhs) {
					mark(x.Rhs[i])
				}
			}
		case *ast.ValueSpec:
			for i, name := range x.Names {
				if i < len(x.Values) && namesReason(name) {
					mark(x.Values[i])
				}
			}
		case *ast.KeyValueExpr:
			if namesReason(x.Key) {
				mark(x.Value)
			}
		}
		return true
	})
	return lits
}

var reasonName = regexp.MustCompile(`(?i)reason`)

// namesReason is whether e is a name (x, x.y, or a call x.y()) that says reason.
func namesReason(e ast.Expr) bool {
	switch x := ast.Unparen(e).(type) {
	case *ast.Ident:
		return reasonName.MatchString(x.Name)
	case *ast.SelectorExpr:
		return reasonName.MatchString(x.Sel.Name)
	case *ast.CallExpr:
		return namesReason(x.Fun)
	}
	return false
}
