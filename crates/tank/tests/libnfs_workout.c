/* A workout of tank's NFS server through libnfs' own C API (the library behind nfs-cp and
 * friends, and behind many user-space clients): every call a file manager or copy tool
 * makes, each result checked. Built and run by tests/nfs.rs:
 *
 *     libnfs_workout 'nfs://127.0.0.1/share?version=3&nfsport=P&mountport=P'
 *
 * Prints "libnfs workout: N checks passed" and exits 0, or names the first check that
 * failed and exits 1. Leaves final/a ("hello from libnfs\n") for the caller to find. */

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <nfsc/libnfs.h>

static struct nfs_context *nfs;
static int checks;

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (!(cond)) {                                             \
			fprintf(stderr, "check failed at line %d: ", __LINE__); \
			fprintf(stderr, __VA_ARGS__);                      \
			fprintf(stderr, " (%s)\n", nfs_get_error(nfs));    \
			exit(1);                                           \
		}                                                          \
		checks++;                                                  \
	} while (0)

static void pattern(unsigned char *buf, size_t len, uint64_t seed)
{
	uint64_t x = seed | 1;
	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = (unsigned char)x;
	}
}

/* The names in a directory, "." and ".." left out; sizes of those asked for. */
static int count_entries(const char *dir, const char *want, uint64_t *size)
{
	struct nfsdir *d;
	struct nfsdirent *e;
	int n = 0;
	int rc = nfs_opendir(nfs, dir, &d);
	CHECK(rc == 0, "opendir %s: %d", dir, rc);
	while ((e = nfs_readdir(nfs, d)) != NULL) {
		if (!strcmp(e->name, ".") || !strcmp(e->name, ".."))
			continue;
		if (want && !strcmp(e->name, want) && size)
			*size = e->size;
		n++;
	}
	nfs_closedir(nfs, d);
	return n;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s nfs://HOST/SHARE?...\n", argv[0]);
		return 2;
	}
	nfs = nfs_init_context();
	CHECK(nfs != NULL, "init");
	struct nfs_url *url = nfs_parse_url_dir(nfs, argv[1]);
	CHECK(url != NULL, "parse %s", argv[1]);
	int rc = nfs_mount(nfs, url->server, url->path);
	CHECK(rc == 0, "mount %s:%s: %d", url->server, url->path, rc);

	struct nfs_statvfs_64 vfs;
	rc = nfs_statvfs64(nfs, "/", &vfs);
	CHECK(rc == 0 && vfs.f_blocks > 0 && vfs.f_bfree <= vfs.f_blocks, "statvfs");

	CHECK(nfs_mkdir(nfs, "/d") == 0, "mkdir d");
	CHECK(nfs_mkdir(nfs, "/d") == -EEXIST, "mkdir d again is EEXIST");

	/* 3 MiB in pieces of odd sizes at odd offsets, then read back whole. */
	enum { LEN = 3 << 20 };
	unsigned char *buf = malloc(LEN), *back = malloc(LEN + 4096);
	pattern(buf, LEN, 7);
	struct nfsfh *fh;
	rc = nfs_creat(nfs, "/d/f", 0640, &fh);
	CHECK(rc == 0, "creat d/f: %d", rc);
	for (size_t at = 0; at < LEN;) {
		size_t n = 77777 + (at % 300000);
		if (at + n > LEN)
			n = LEN - at;
		rc = nfs_pwrite(nfs, fh, at, n, buf + at);
		CHECK(rc == (int)n, "pwrite %zu at %zu: %d", n, at, rc);
		at += n;
	}
	CHECK(nfs_fsync(nfs, fh) == 0, "fsync");
	for (size_t at = 0; at < LEN;) {
		rc = nfs_pread(nfs, fh, at, 1 << 20, back + at);
		CHECK(rc > 0, "pread at %zu: %d", at, rc);
		at += rc;
	}
	CHECK(memcmp(buf, back, LEN) == 0, "read back differs");
	struct nfs_stat_64 st;
	CHECK(nfs_fstat64(nfs, fh, &st) == 0 && st.nfs_size == LEN, "fstat size");
	CHECK((st.nfs_mode & 0777) == 0640, "mode 0640, got %o", (unsigned)st.nfs_mode);

	/* A hole: a write at 5 MiB, zeros between. */
	rc = nfs_pwrite(nfs, fh, 5 << 20, 10, "0123456789");
	CHECK(rc == 10, "pwrite past the end");
	rc = nfs_pread(nfs, fh, 4 << 20, 4096, back);
	CHECK(rc == 4096, "read in the hole: %d", rc);
	for (int i = 0; i < 4096; i++)
		CHECK(back[i] == 0, "the hole reads zeros");
	CHECK(nfs_fstat64(nfs, fh, &st) == 0 && st.nfs_size == (5 << 20) + 10, "size after the hole");

	CHECK(nfs_ftruncate(nfs, fh, 1000) == 0, "ftruncate");
	CHECK(nfs_fstat64(nfs, fh, &st) == 0 && st.nfs_size == 1000, "size after truncate");
	rc = nfs_pread(nfs, fh, 0, 4096, back);
	CHECK(rc == 1000 && memcmp(back, buf, 1000) == 0, "read after truncate: %d", rc);
	CHECK(nfs_close(nfs, fh) == 0, "close");

	CHECK(nfs_chmod(nfs, "/d/f", 0600) == 0, "chmod");
	CHECK(nfs_stat64(nfs, "/d/f", &st) == 0 && (st.nfs_mode & 0777) == 0600, "mode after chmod");
	struct timeval tv[2] = {{1000000000, 250000}, {1000000001, 123456}};
	CHECK(nfs_utimes(nfs, "/d/f", tv) == 0, "utimes");
	CHECK(nfs_stat64(nfs, "/d/f", &st) == 0 && st.nfs_mtime == 1000000001 &&
		      st.nfs_mtime_nsec == 123456000 && st.nfs_atime == 1000000000,
	      "times after utimes: %llu.%09llu", (unsigned long long)st.nfs_mtime,
	      (unsigned long long)st.nfs_mtime_nsec);

	CHECK(nfs_symlink(nfs, "some/target", "/d/l") == 0, "symlink");
	char link[256] = {0};
	CHECK(nfs_readlink(nfs, "/d/l", link, sizeof link - 1) == 0 && !strcmp(link, "some/target"),
	      "readlink: %s", link);
	CHECK(nfs_link(nfs, "/d/f", "/d/h") == 0, "link");
	CHECK(nfs_stat64(nfs, "/d/f", &st) == 0 && st.nfs_nlink == 2, "nlink 2");
	CHECK(nfs_rename(nfs, "/d/h", "/d/h2") == 0, "rename");
	CHECK(nfs_stat64(nfs, "/d/h", &st) == -ENOENT, "old name gone");
	CHECK(nfs_stat64(nfs, "/d/h2", &st) == 0 && st.nfs_size == 1000, "new name");
	uint64_t fsize = 0;
	CHECK(count_entries("/d", "f", &fsize) == 3 && fsize == 1000, "d lists f, l, h2 (f: %llu bytes)",
	      (unsigned long long)fsize);
	CHECK(nfs_access(nfs, "/d/f", R_OK | W_OK) == 0, "access");

	/* 300 files: the listing goes over several READDIRPLUS pages. */
	CHECK(nfs_mkdir(nfs, "/d/many") == 0, "mkdir many");
	char name[64];
	for (int i = 0; i < 300; i++) {
		snprintf(name, sizeof name, "/d/many/file-with-a-longish-name-%03d", i);
		rc = nfs_creat(nfs, name, 0644, &fh);
		CHECK(rc == 0, "creat %s: %d", name, rc);
		CHECK(nfs_pwrite(nfs, fh, 0, 4, "abcd") == 4, "write %s", name);
		nfs_close(nfs, fh);
	}
	CHECK(count_entries("/d/many", NULL, NULL) == 300, "300 entries listed");
	CHECK(nfs_rmdir(nfs, "/d/many") == -ENOTEMPTY, "rmdir of a full directory");
	for (int i = 0; i < 300; i++) {
		snprintf(name, sizeof name, "/d/many/file-with-a-longish-name-%03d", i);
		CHECK(nfs_unlink(nfs, name) == 0, "unlink %s", name);
	}
	CHECK(nfs_rmdir(nfs, "/d/many") == 0, "rmdir many");
	CHECK(nfs_open(nfs, "/d/nothing", O_RDONLY, &fh) == -ENOENT, "open of a missing file");
	CHECK(nfs_unlink(nfs, "/d/f") == 0 && nfs_unlink(nfs, "/d/h2") == 0 &&
		      nfs_unlink(nfs, "/d/l") == 0 && nfs_rmdir(nfs, "/d") == 0,
	      "clean up d");

	CHECK(nfs_mkdir(nfs, "/final") == 0, "mkdir final");
	CHECK(nfs_creat(nfs, "/final/a", 0644, &fh) == 0, "creat final/a");
	const char *hello = "hello from libnfs\n";
	CHECK(nfs_write(nfs, fh, strlen(hello), hello) == (int)strlen(hello), "write final/a");
	CHECK(nfs_close(nfs, fh) == 0, "close final/a");

	nfs_destroy_url(url);
	nfs_destroy_context(nfs);
	free(buf);
	free(back);
	printf("libnfs workout: %d checks passed\n", checks);
	return 0;
}
