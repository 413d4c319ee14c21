package main

import (
	"fmt"
	"os"
	"os/exec"
	"time"
)

func main() {
	time.Sleep(25 * time.Second)
	out, _ := exec.Command("kubectl", "--kubeconfig", os.Args[2], "get", "nodes,gpunodes,pods,leases", "-A", "-o", "wide").CombinedOutput()
	fmt.Println(string(out))
}
