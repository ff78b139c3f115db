/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * vmmrt-torture: where every thread of the process is, for the reports of a
 * hang (the watchdog) and of a crash (the crash handler). There is no
 * debugger on the GPU machines, so the torture prints the stacks itself.
 *
 * The dumper lists /proc/self/task and, one thread at a time, sends the
 * thread a real-time signal of its own (tgkill); the thread's handler takes
 * its backtrace() into a buffer the dumper owns and acknowledges through an
 * atomic, and the dumper formats the frames (dladdr: module + offset, for
 * addr2line, and the symbol when there is one). One thread at a time, so
 * nothing interleaves; at most a second per thread, so a thread that cannot
 * take the signal does not hang the dump. A thread that blocks every signal
 * (the host backend's stream threads; a driver's own threads may too) or does
 * not answer gets, instead, the user pc and sp of the system call it sleeps in
 * (/proc/self/task/T/syscall) and a scan of its stack from that sp for
 * return addresses (marked '?': the scan finds stale ones too). Every thread
 * gets its name, its State: line and its wchan, which say what a thread stuck
 * in the kernel waits for.
 *
 * Output goes straight to the file descriptor through write(): the crash
 * handler calls this too. Everything here but dladdr() (which the dumper
 * calls, not the signalled threads) is async-signal-safe in practice:
 * backtrace() is called once at start so that libgcc is loaded before any
 * handler needs it.
 */
#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "torture.h"

#define MAXFRAMES 64    /* frames per thread */
#define MAXTHREADS 1024 /* threads per dump */
#define MAXLABELS 160   /* threads of the torture's own, named in the headers */
#define MAXEXEC 512     /* executable mappings, for the stack scan */
#define MAXSCAN 24      /* candidate return addresses per scanned stack */
#define SCAN_BYTES (64 << 10)
#define ANSWER_NS 1000000000ull /* how long a thread has to answer */

static int dump_sig;
static char exe_path[512] = "(the executable)";

/* ------------------------------------------------------------------ output */

typedef struct sout {
	int fd;
	size_t n;
	char b[1024];
} sout;

void t_write_all(int fd, const char *p, size_t n)
{
	size_t at = 0;
	while (at < n) {
		ssize_t w = write(fd, p + at, n - at);
		if (w <= 0) {
			if (w < 0 && errno == EINTR)
				continue;
			break;
		}
		at += (size_t)w;
	}
}

static void s_flush(sout *o)
{
	t_write_all(o->fd, o->b, o->n);
	o->n = 0;
}

static void s_ch(sout *o, char c)
{
	if (o->n == sizeof(o->b))
		s_flush(o);
	o->b[o->n++] = c;
}

static void s_str(sout *o, const char *s)
{
	while (*s)
		s_ch(o, *s++);
}

static void s_dec(sout *o, uint64_t v)
{
	char t[24];
	int i = 0;
	do
		t[i++] = (char)('0' + v % 10);
	while ((v /= 10) && i < 23);
	while (i > 0)
		s_ch(o, t[--i]);
}

static void s_hex(sout *o, uint64_t v)
{
	int sh = 60;
	s_str(o, "0x");
	while (sh > 0 && !((v >> sh) & 15))
		sh -= 4;
	for (; sh >= 0; sh -= 4)
		s_ch(o, "0123456789abcdef"[(v >> sh) & 15]);
}

/* ------------------------------------------------------------- small helpers */

int t_gettid(void)
{
	return (int)syscall(SYS_gettid);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void nap_us(long us)
{
	struct timespec ts = {0, us * 1000};
	nanosleep(&ts, NULL);
}

/* A whole (small) file of /proc into buf, NUL-terminated; its length, or -1. */
static ssize_t read_small(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t n = 0;
	if (fd < 0)
		return -1;
	while (n < len - 1) {
		ssize_t r = read(fd, buf + n, len - 1 - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	buf[n] = '\0';
	return (ssize_t)n;
}

/* "/proc/self/task/<tid>/<leaf>" */
static void task_path(char *out, size_t len, int tid, const char *leaf)
{
	sout o = {.fd = -1, .n = 0};
	s_str(&o, "/proc/self/task/");
	s_dec(&o, (uint64_t)tid);
	s_str(&o, "/");
	s_str(&o, leaf);
	size_t n = o.n < len - 1 ? o.n : len - 1;
	memcpy(out, o.b, n);
	out[n] = '\0';
}

static uint64_t parse_hex(const char *s, const char **end)
{
	uint64_t v = 0;
	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
		s += 2;
	for (;; s++) {
		int d = *s >= '0' && *s <= '9' ? *s - '0' : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10
			: *s >= 'A' && *s <= 'F' ? *s - 'A' + 10 : -1;
		if (d < 0)
			break;
		v = v << 4 | (uint64_t)d;
	}
	if (end)
		*end = s;
	return v;
}

/* ----------------------------------------------------------------- labels */

/* The torture's own threads say what they are, for the headers. */
static struct {
	_Atomic int claimed;
	_Atomic int tid;
	const char *what;
	int num;
} labels[MAXLABELS];

/* The outermost frames (the main thread's, the other threads'), where a stack scan stops. */
static _Atomic uintptr_t root_main, root_thread;

static void note_root(void)
{
	void *f[MAXFRAMES];
	int n = backtrace(f, MAXFRAMES);
	if (n > 0 && n < MAXFRAMES)
		atomic_store(t_gettid() == getpid() ? &root_main : &root_thread, (uintptr_t)f[n - 1]);
}

void t_stacks_label(const char *what, int num)
{
	for (unsigned i = 0; i < MAXLABELS; i++) {
		int z = 0;
		if (atomic_compare_exchange_strong(&labels[i].claimed, &z, 1)) {
			labels[i].what = what;
			labels[i].num = num;
			atomic_store_explicit(&labels[i].tid, t_gettid(), memory_order_release);
			note_root();
			return;
		}
	}
}

static bool label_of(int tid, const char **what, int *num)
{
	for (unsigned i = 0; i < MAXLABELS; i++)
		if (atomic_load_explicit(&labels[i].tid, memory_order_acquire) == tid) {
			*what = labels[i].what;
			*num = labels[i].num;
			return true;
		}
	return false;
}

/* ------------------------------------------------- the signalled thread's side */

#define REQ_IDLE 0
#define REQ_CLAIMED (-1) /* the thread asked is writing its frames */
#define REQ_DONE (-2)    /* its frames are in answer[] */

static _Atomic int req;  /* the tid asked now (> 0), or REQ_* */
static void *answer[MAXFRAMES];
static int answer_n;     /* -1: its unwinder faulted */
static bool answer_exact; /* answer[0] is the interrupted instruction */
static __thread sigjmp_buf *escape;

static uintptr_t uc_pc(void *ucv)
{
	ucontext_t *uc = ucv;
	if (!uc)
		return 0;
#if defined(__x86_64__)
	return (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
	return (uintptr_t)uc->uc_mcontext.pc;
#else
	return 0;
#endif
}

/* This thread's frames, starting at pc when it is among them (the
 * instruction a signal interrupted: the handler's frames and the signal
 * trampoline go, and *exact tells that out[0] is that instruction, not a
 * return address), else after the first `skip` frames. -1 if unwinding faulted. */
static __attribute__((noinline)) int capture(void **out, uintptr_t pc, int skip, bool *exact)
{
	void *f[MAXFRAMES + 16];
	volatile int n = -1;
	sigjmp_buf jb;
	*exact = false;
	if (sigsetjmp(jb, 1) == 0) {
		escape = &jb;
		n = backtrace(f, MAXFRAMES + 16);
	}
	escape = NULL;
	if (n < 0)
		return -1;
	int from = skip + 1; /* and this function's own frame */
	for (int i = 0; pc && i < n; i++)
		if ((uintptr_t)f[i] == pc) {
			from = i;
			*exact = true;
			break;
		}
	int k = 0;
	for (int i = from; i < n && k < MAXFRAMES; i++)
		out[k++] = f[i];
	return k;
}

void t_stacks_fault_escape(void)
{
	sigjmp_buf *jb = escape;
	if (jb) {
		escape = NULL;
		siglongjmp(*jb, 1);
	}
}

static void on_dump_signal(int sig, siginfo_t *si, void *uc)
{
	int saved = errno;
	int self = t_gettid();
	void *f[MAXFRAMES];
	(void)sig;
	(void)si;
	/* Only the thread asked now: a late answer to a request given up on is dropped. */
	if (atomic_load(&req) == self) {
		bool exact;
		int n = capture(f, uc_pc(uc), 0, &exact);
		int want = self;
		if (atomic_compare_exchange_strong(&req, &want, REQ_CLAIMED)) {
			for (int i = 0; i < n; i++)
				answer[i] = f[i];
			answer_n = n;
			answer_exact = exact;
			atomic_store(&req, REQ_DONE);
		}
	}
	errno = saved;
}

void t_stacks_init(void)
{
	void *f[4];
	struct sigaction sa;
	/* Loads libgcc's unwinder now: its first call allocates, which a signal handler must not. */
	(void)backtrace(f, 4);
	ssize_t n = readlink("/proc/self/exe", exe_path, sizeof(exe_path) - 1);
	if (n > 0)
		exe_path[n] = '\0';
	dump_sig = SIGRTMIN + 5;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_dump_signal;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	/* Nothing else interrupts the handler; faults stay deliverable (the crash handler). */
	sigfillset(&sa.sa_mask);
	sigdelset(&sa.sa_mask, SIGSEGV);
	sigdelset(&sa.sa_mask, SIGBUS);
	sigdelset(&sa.sa_mask, SIGILL);
	sigdelset(&sa.sa_mask, SIGFPE);
	sigdelset(&sa.sa_mask, SIGABRT);
	if (sigaction(dump_sig, &sa, NULL) != 0)
		dump_sig = 0;
}

/* ------------------------------------------------------------------ frames */

/* A frame: its module and offset in it (what addr2line takes) and its symbol,
 * if dladdr knows one. A return address (ret) is shown minus one: inside the
 * call instruction, so that both name the call, not what follows it (the
 * call of a noreturn function can be a function's last instruction). */
static void put_frame(sout *o, char mark, int i, uintptr_t a, bool ret)
{
	Dl_info di;
	struct link_map *lm = NULL;
	if (ret && a)
		a--;
	s_str(o, "  ");
	s_ch(o, mark);
	s_dec(o, (uint64_t)i);
	s_ch(o, ' ');
	if (dladdr1((void *)a, &di, (void **)&lm, RTLD_DL_LINKMAP) && lm) {
		/* The offset from the load bias is the address in the file, what addr2line wants. */
		s_str(o, lm->l_name && lm->l_name[0] ? lm->l_name : exe_path);
		s_ch(o, '+');
		s_hex(o, a - (uintptr_t)lm->l_addr);
		if (di.dli_sname) {
			s_str(o, " (");
			s_str(o, di.dli_sname);
			s_ch(o, '+');
			s_hex(o, a - (uintptr_t)di.dli_saddr);
			s_ch(o, ')');
		}
	} else {
		s_hex(o, a);
		s_str(o, " (in no module)");
	}
	s_ch(o, '\n');
}

/* ------------------------------------------- threads that take no signal */

static struct {
	uintptr_t lo, hi;
} execs[MAXEXEC];
static unsigned nexec;

/* The executable mappings, from /proc/self/maps (it can be long: read in pieces). */
static void load_exec_maps(void)
{
	static char buf[8192];
	size_t have = 0;
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	nexec = 0;
	if (fd < 0)
		return;
	for (;;) {
		ssize_t r = read(fd, buf + have, sizeof(buf) - 1 - have);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		have += (size_t)r;
		buf[have] = '\0';
		char *line = buf, *nl;
		while ((nl = memchr(line, '\n', have - (size_t)(line - buf)))) {
			const char *p;
			uintptr_t lo = parse_hex(line, &p), hi = 0;
			if (*p == '-')
				hi = parse_hex(p + 1, &p);
			/* "lo-hi rwxp ..." */
			if (*p == ' ' && p[1] && p[2] && p[3] == 'x' && nexec < MAXEXEC) {
				execs[nexec].lo = lo;
				execs[nexec].hi = hi;
				nexec++;
			}
			line = nl + 1;
		}
		have -= (size_t)(line - buf);
		memmove(buf, line, have);
		if (have == sizeof(buf) - 1)
			have = 0; /* a line that long is no mapping of ours */
	}
	close(fd);
}

static bool in_exec(uintptr_t a)
{
	for (unsigned i = 0; i < nexec; i++)
		if (a >= execs[i].lo && a < execs[i].hi)
			return true;
	return false;
}

/* Reads another thread's memory without faulting on a bad address. */
static bool peek(uintptr_t addr, void *buf, size_t len)
{
	struct iovec local = {buf, len}, remote = {(void *)addr, len};
	return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)len;
}

/* Whether the instruction just before a is a call, so a is a return address. */
static bool after_call(uintptr_t a)
{
#if defined(__x86_64__)
	unsigned char b[8];
	if (a < 8 || !peek(a - 8, b, 8))
		return false;
	if (b[3] == 0xe8) /* call rel32 */
		return true;
	/* call r/m64: ff /2, k bytes long from its opcode */
	for (int k = 2; k <= 7; k++) {
		unsigned char op = b[8 - k], m = b[8 - k + 1];
		if (op != 0xff || ((m >> 3) & 7) != 2)
			continue;
		int mod = m >> 6, rm = m & 7, len = 2;
		if (mod == 0)
			len = rm == 5 ? 6 : rm == 4 ? ((b[8 - k + 2] & 7) == 5 ? 7 : 3) : 2;
		else if (mod == 1)
			len = rm == 4 ? 4 : 3;
		else if (mod == 2)
			len = rm == 4 ? 7 : 6;
		if (len == k)
			return true;
	}
	return false;
#elif defined(__aarch64__)
	uint32_t insn;
	if (a < 4 || !peek(a - 4, &insn, 4))
		return false;
	return (insn & 0xfc000000u) == 0x94000000u /* bl */ || (insn & 0xfffffc1fu) == 0xd63f0000u /* blr */;
#else
	(void)a;
	return false;
#endif
}

/* The user pc and sp of the system call the thread sleeps in, and the return
 * addresses found on its stack above that sp. */
static void scan_stack(sout *o, int tid, const char *why)
{
	char path[64], sc[256];
	s_str(o, "  (no backtrace: ");
	s_str(o, why);
	task_path(path, sizeof(path), tid, "syscall");
	if (read_small(path, sc, sizeof(sc)) <= 0) {
		s_str(o, "; no /proc syscall file, no stack)\n");
		return;
	}
	if (!strncmp(sc, "running", 7)) {
		s_str(o, "; running, not in a system call: no stack)\n");
		return;
	}
	/* "nr a1 a2 a3 a4 a5 a6 sp pc", or "-1 sp pc" outside a system call */
	const char *tok[9];
	int nt = 0;
	for (char *p = sc; *p && nt < 9;) {
		while (*p == ' ' || *p == '\n')
			p++;
		if (!*p)
			break;
		tok[nt++] = p;
		while (*p && *p != ' ' && *p != '\n')
			p++;
	}
	if (nt < 3) {
		s_str(o, "; unreadable /proc syscall file, no stack)\n");
		return;
	}
	uintptr_t sp = parse_hex(tok[nt - 2], NULL), pc = parse_hex(tok[nt - 1], NULL);
	if (tok[0][0] == '-')
		s_str(o, "; blocked, not in a system call");
	else {
		s_str(o, "; in system call ");
		for (const char *p = tok[0]; *p && *p != ' '; p++)
			s_ch(o, *p);
	}
	s_str(o, ", sp ");
	s_hex(o, sp);
	s_str(o, "; '?' frames: return addresses found on its stack, stale ones among them)\n");
	put_frame(o, '#', 0, pc, false);
	if (!nexec)
		load_exec_maps();
	uintptr_t words[4096 / sizeof(uintptr_t)];
	int found = 0;
	/* A page at a time (the first one from sp on), until a page cannot be read. */
	for (uintptr_t at = sp & ~(uintptr_t)7; at < sp + SCAN_BYTES && found < MAXSCAN;) {
		uintptr_t end = (at | 4095) + 1;
		size_t len = (size_t)(end - at);
		if (!peek(at, words, len)) {
			if (errno == ENOSYS || errno == EPERM)
				s_str(o, "  (process_vm_readv refused: no stack scan)\n");
			break;
		}
		for (size_t i = 0; i < len / sizeof(words[0]) && found < MAXSCAN; i++)
			if (in_exec(words[i]) && after_call(words[i]))
			{
				put_frame(o, '?', ++found, words[i], true);
				if (words[i] == atomic_load(&root_main) || words[i] == atomic_load(&root_thread))
					return; /* the thread's first frame: above it lies no frame of it */
			}
		at = end;
	}
}

/* -------------------------------------------------------------- the dumper */

static _Atomic int dumping;

static int list_tasks(int *tids, int max, int *total)
{
	char buf[4096];
	int n = 0;
	*total = 0;
	int fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	for (;;) {
		long r = syscall(SYS_getdents64, fd, buf, sizeof(buf));
		if (r <= 0)
			break;
		for (long at = 0; at < r;) {
			struct {
				uint64_t ino;
				int64_t off;
				unsigned short reclen;
				unsigned char type;
				char name[];
			} *d = (void *)(buf + at);
			at += d->reclen;
			if (d->name[0] < '0' || d->name[0] > '9')
				continue;
			int tid = 0;
			for (const char *p = d->name; *p >= '0' && *p <= '9'; p++)
				tid = tid * 10 + (*p - '0');
			(*total)++;
			if (n < max)
				tids[n++] = tid;
		}
	}
	close(fd);
	return n;
}

static bool blocks_signal(const char *status, int sig)
{
	const char *p = strstr(status, "\nSigBlk:");
	if (!p || sig <= 0)
		return false;
	p += 8;
	while (*p == ' ' || *p == '\t')
		p++;
	return (parse_hex(p, NULL) >> (sig - 1)) & 1;
}

/* Asks one thread for its frames: their number, 0 when it did not answer, -1 on a fault. */
static int ask(int tid, const char **why, bool *exact, void **f)
{
	int idle = REQ_IDLE;
	if (!atomic_compare_exchange_strong(&req, &idle, tid)) {
		*why = "an earlier thread still writes its answer";
		return 0;
	}
	if (syscall(SYS_tgkill, getpid(), tid, dump_sig) != 0) {
		atomic_store(&req, REQ_IDLE);
		*why = errno == ESRCH ? "it exited" : "tgkill failed";
		return 0;
	}
	uint64_t until = now_ns() + ANSWER_NS;
	while (atomic_load(&req) != REQ_DONE && now_ns() < until)
		nap_us(500);
	int want = tid;
	if (atomic_compare_exchange_strong(&req, &want, REQ_IDLE)) {
		*why = "it did not answer the signal in 1 s";
		return 0;
	}
	/* It answered, or is answering: a second more for it to finish. */
	until = now_ns() + ANSWER_NS;
	while (atomic_load(&req) != REQ_DONE && now_ns() < until)
		nap_us(500);
	if (atomic_load(&req) != REQ_DONE) {
		*why = "it did not finish its answer in 1 s"; /* req stays claimed: no one else is asked */
		return 0;
	}
	int n = answer_n;
	*exact = answer_exact;
	for (int i = 0; i < n; i++)
		f[i] = answer[i];
	atomic_store(&req, REQ_IDLE);
	if (n < 0)
		*why = "its unwinder faulted";
	return n;
}

static __attribute__((noinline)) void dump_one(sout *o, int tid, int self, void *self_uc)
{
	char path[64], comm[64], status[4096], wchan[128];
	void *f[MAXFRAMES];
	const char *what, *why = NULL;
	bool exact0 = false;
	int num, n;

	task_path(path, sizeof(path), tid, "comm");
	if (read_small(path, comm, sizeof(comm)) < 0) {
		s_str(o, "thread ");
		s_dec(o, (uint64_t)tid);
		s_str(o, ": exited\n");
		return;
	}
	comm[strcspn(comm, "\n")] = '\0';
	task_path(path, sizeof(path), tid, "status");
	if (read_small(path, status, sizeof(status)) < 0)
		status[0] = '\0';
	task_path(path, sizeof(path), tid, "wchan");
	if (read_small(path, wchan, sizeof(wchan)) <= 0)
		strcpy(wchan, "?");

	/* thread 1234 'vmmrt-drv-0' (torture thread 0): State: S (sleeping), wchan: hrtimer_nanosleep */
	s_str(o, "thread ");
	s_dec(o, (uint64_t)tid);
	s_str(o, " '");
	s_str(o, comm);
	s_str(o, "'");
	bool labelled = label_of(tid, &what, &num);
	if (labelled || tid == self) {
		s_str(o, " (");
		if (labelled) {
			s_str(o, what);
			if (num >= 0) {
				s_ch(o, ' ');
				s_dec(o, (uint64_t)num);
			}
		}
		if (tid == self) {
			/* from a crash handler: the thread whose fault the report is about */
			if (labelled)
				s_str(o, ", ");
			s_str(o, self_uc ? "crashed" : "dumping");
		}
		s_ch(o, ')');
	}
	s_str(o, ": State: ");
	const char *st = strstr(status, "State:");
	if (st) {
		st += 6;
		while (*st == ' ' || *st == '\t')
			st++;
		while (*st && *st != '\n')
			s_ch(o, *st++);
	} else
		s_str(o, "?");
	s_str(o, ", wchan: ");
	s_str(o, wchan[0] == '0' && !wchan[1] ? "0 (none)" : wchan);
	s_ch(o, '\n');

	if (tid == self) {
		/* The dumper's own: from a crash handler, from the faulting instruction on. */
		n = capture(f, uc_pc(self_uc), 1, &exact0);
		if (n < 0)
			why = "its unwinder faulted";
	} else if (!dump_sig) {
		n = 0;
		why = "no signal to ask it with";
	} else if (blocks_signal(status, dump_sig)) {
		n = 0;
		why = "it blocks the signal";
	} else {
		n = ask(tid, &why, &exact0, f);
	}
	if (n > 0) {
		for (int i = 0; i < n; i++)
			put_frame(o, '#', i, (uintptr_t)f[i], i > 0 || !exact0);
		return;
	}
	scan_stack(o, tid, why ? why : "no frames");
}

void t_stacks_dump(int fd, const char *why, int first_tid, void *self_uc)
{
	static int tids[MAXTHREADS];
	sout o = {.fd = fd, .n = 0};
	int self = t_gettid(), total;

	if (atomic_exchange(&dumping, 1)) {
		s_str(&o, "STACKS: another thread is dumping them\n");
		s_flush(&o);
		return;
	}
	int n = list_tasks(tids, MAXTHREADS, &total);
	nexec = 0;
	s_str(&o, "STACKS of the ");
	s_dec(&o, (uint64_t)total);
	s_str(&o, " threads of process ");
	s_dec(&o, (uint64_t)getpid());
	s_str(&o, " at the ");
	s_str(&o, why);
	s_str(&o, " (resolve MODULE+OFFSET with: addr2line -f -i -e MODULE OFFSET)\n");
	s_flush(&o);
	/* The thread the failure is about first, then the others in the kernel's order. */
	if (first_tid > 0)
		dump_one(&o, first_tid, self, self_uc), s_flush(&o);
	for (int i = 0; i < n; i++)
		if (tids[i] != first_tid) {
			dump_one(&o, tids[i], self, self_uc);
			s_flush(&o);
		}
	if (total > n) {
		s_str(&o, "(and ");
		s_dec(&o, (uint64_t)(total - n));
		s_str(&o, " threads more)\n");
	}
	s_str(&o, "END STACKS\n");
	s_flush(&o);
}
