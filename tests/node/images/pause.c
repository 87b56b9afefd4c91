/* The pod sandbox's process for the test node's pause image: holds the pod's namespaces open,
 * reaps orphans, and exits at once on SIGINT or SIGTERM (what containerd sends to stop it). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction stop = {.sa_handler = quit}, child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0)
    return 1;
  for (;;)
    pause();
}
