package server

import corev1 "k8s.io/api/core/v1"

func corev1Effect(s string) corev1.TaintEffect { return corev1.TaintEffect(s) }
